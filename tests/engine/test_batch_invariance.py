"""``batch_invariant=True``: a seeded request gives the same tokens, and bit-identical logprobs,
served alone and inside a mixed batch (other lengths, a prompt long enough to be chunked beside
decodes, other adapters, requests already decoding). The default mode is the control: on the same
workload its logprobs differ between the two runs (the GEMM blocking and the attention path follow
the batch: kernels/batch_invariant.py says where), so this test fails without the mode.
"""

from __future__ import annotations

import pytest
from lora_testlib import ATTN, MLP, make_peft_adapter

from loraplex.engine import EngineConfig, EngineRequest, LLMEngine, SamplingParams
from loraplex.kernels import cpu_native

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="batch_invariant needs the native CPU kernels")

# > 128: chunked when decodes share the step, into 128 + 7. The short second chunk keeps the default
# mode's control below honest: chunks of >= 16 rows take the prompt-attention kernel whole or not
# (row results independent of the chunking), a 7-row chunk takes the paged tile.
SEEDED_PROMPT = [(i * 37) % 300 + 3 for i in range(135)]
OTHERS = [  # (prompt, adapter): short, long, base model and both adapters
    ([5] * 10, None),
    ([9] * 90, "mlp"),
    ([7] * 40, "attn"),
    ([11 + i % 50 for i in range(300)], None),
]


@pytest.fixture(scope="module")
def setup(model_factory, tmp_path_factory):
    model = model_factory("llama3_rope_tied_bf16")
    root = tmp_path_factory.mktemp("bi_adapters")
    adapters = {
        "attn": make_peft_adapter(model, root / "attn", seed=3, r=8, lora_alpha=16, target_modules=ATTN),
        "mlp": make_peft_adapter(model, root / "mlp", seed=4, r=4, lora_alpha=8, target_modules=MLP),
    }
    return model, adapters


def _serve(model: str, adapters: dict[str, str], invariant: bool, dtype: str, crowd: bool) -> tuple[list, list]:
    engine = LLMEngine(
        EngineConfig(
            model=model,
            dtype=dtype,
            batch_invariant=invariant,
            max_num_seqs=8,
            num_kv_blocks=160,
            block_size=16,
            enable_prefix_caching=False,
        )
    )
    for name, path in adapters.items():
        engine.lora.add_adapter(name, path)
    if crowd:
        for i, (prompt, adapter) in enumerate(OTHERS):
            params = SamplingParams(max_tokens=30, temperature=0.9, ignore_eos=True)
            engine.add_request(EngineRequest(prompt, params, adapter=adapter, request_id=f"other{i}"))
        for _ in range(3):  # the others are decoding when the seeded request arrives
            engine.step()
    seeded = SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True, logprobs=0)
    engine.add_request(EngineRequest(SEEDED_PROMPT, seeded, adapter="attn", request_id="seeded"))
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == "seeded" and o.finished:
                out = o
    assert out is not None and out.error is None
    return out.token_ids, [lp.logprob for lp in out.outputs[0].logprobs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_seeded_request_is_bit_identical_alone_and_in_a_mixed_batch(setup, dtype):
    model, adapters = setup
    alone = _serve(model, adapters, True, dtype, crowd=False)
    crowded = _serve(model, adapters, True, dtype, crowd=True)
    assert crowded[0] == alone[0]  # the tokens
    assert crowded[1] == alone[1]  # and every logprob, to the bit: the same computation per row


def test_default_mode_is_not_batch_invariant(setup):
    """The control: without the mode the same request's logprobs change with its batch, so the
    test above is not passing because the workload cannot tell the modes apart."""
    model, adapters = setup
    alone = _serve(model, adapters, False, "bfloat16", crowd=False)
    crowded = _serve(model, adapters, False, "bfloat16", crowd=True)
    assert crowded[1] != alone[1]


def test_refused_where_it_cannot_hold(tiny_llama):
    with pytest.raises(ValueError, match="speculative_method"):
        EngineConfig(model=tiny_llama, batch_invariant=True, speculative_method="ngram")
    with pytest.raises(ValueError, match="native CPU kernels"):
        LLMEngine(EngineConfig(model=tiny_llama, batch_invariant=True, kernel_backend="torch", num_kv_blocks=16))
