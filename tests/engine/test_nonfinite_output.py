"""A request whose model output is not finite (NaN / inf) fails with a clear error instead of
streaming token 0 with logprob NaN, and only that request: the rows beside it in the same steps
finish exactly as they do alone.

The cause here is a hostile adapter (its q and k LoRA B scaled by 1e33: the rotated q|k rows
overflow bf16, the attention turns them into NaN), found by a hostile run against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_testlib import ATTN, make_peft_adapter
from safetensors.torch import load_file, save_file

from loraplex.engine import LLM, FinishReason, SamplingParams


def _overflowing(adapter: str, out: Path) -> str:
    out.mkdir()
    for f in Path(adapter).iterdir():
        if f.name == "adapter_model.safetensors":
            scaled = {
                k: v * (1e33 if "lora_B" in k and ("q_proj" in k or "k_proj" in k) else 1.0)
                for k, v in load_file(str(f)).items()
            }
            save_file(scaled, str(out / f.name))
        else:
            (out / f.name).write_bytes(f.read_bytes())
    return str(out)


@pytest.fixture(scope="module")
def llm(model_factory, tmp_path_factory):
    model = model_factory("llama3_rope_tied_bf16")
    root = tmp_path_factory.mktemp("nonfinite")
    good = make_peft_adapter(model, root / "good", seed=3, r=8, lora_alpha=16, target_modules=ATTN)
    engine = LLM(model, dtype="bfloat16", max_num_seqs=8, max_loras=2, max_lora_rank=8)
    engine.add_adapter("good", good)
    engine.add_adapter("huge", _overflowing(good, root / "huge"))
    return engine


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13] * 9, [21, 22, 23, 24]]


def test_the_overflowing_request_fails_and_its_neighbours_do_not_notice(llm):
    greedy = SamplingParams(max_tokens=8, temperature=0.0, logprobs=2, ignore_eos=True)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=4, n=2, ignore_eos=True)
    alone = [
        llm.generate([PROMPTS[1]], greedy, adapters=["good"])[0],
        llm.generate([PROMPTS[2]], seeded, adapters=[None])[0],
    ]
    outs = llm.generate(PROMPTS, [greedy, greedy, seeded], adapters=["huge", "good", None])
    bad = outs[0]
    assert bad.error and "not finite" in bad.error and "'huge'" in bad.error, bad.error
    assert all(o.finish_reason == FinishReason.ERROR for o in bad.outputs)
    for o in bad.outputs:  # nothing of the noise reached the output
        assert all(lp is None or lp.logprob == lp.logprob for lp in o.logprobs or [])
    for got, want in zip(outs[1:], alone):
        assert got.error is None
        assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]
        assert [o.text for o in got.outputs] == [o.text for o in want.outputs]
    assert llm.engine.counters["errors"] >= 1


def test_an_n_greater_than_one_request_fails_whole_and_the_engine_goes_on(llm):
    outs = llm.generate(
        [PROMPTS[0], PROMPTS[2]],
        [SamplingParams(max_tokens=5, temperature=1.0, seed=9, n=3), SamplingParams(max_tokens=5, temperature=0.0)],
        adapters=["huge", None],
    )
    assert outs[0].error and len(outs[0].outputs) == 3
    assert all(o.finish_reason == FinishReason.ERROR for o in outs[0].outputs)
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 5
    after = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=4, temperature=0.0), adapters=["good"])[0]
    assert after.error is None and len(after.outputs[0].token_ids) == 4
