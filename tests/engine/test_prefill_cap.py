"""max_prefill_tokens_with_decodes: while sequences decode, each prompt adds at most that many tokens
to a step (a new admission or a continuing prefill), so a long prompt arriving does not stall the
running streams for one huge step; prompts that arrive together still join one step (the cap is
per prompt, not per step), and without decodes the whole token budget is used. Counted on the
scheduler's plans, and the outputs are the same tokens either way (greedy)."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine


def _engine(model: str, cap: int | None) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_prefill_tokens_with_decodes=cap,
            block_size=8,
            num_kv_blocks=128,
            kernel_backend="torch",
            dtype="float32",
            scheduling_policy="fcfs",
        )
    )


def _drive(
    engine: LLMEngine, n_long: int = 2, long_len: int = 100
) -> tuple[list[tuple[int, int, list[int]]], dict[str, list[int]]]:
    """Two short prompts start decoding, then ``n_long`` prompts of ``long_len`` tokens arrive together.
    Returns per step (decode tokens, prompt tokens, each prompt chunk's size) and each request's output."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(5, vocab) for _ in range(4)], params, request_id=f"s{i}") for i in (0, 1)]
    plans: list[tuple[int, int, list[int]]] = []
    outs: dict[str, list[int]] = {}
    schedule = engine.scheduler.schedule

    def spy():
        plan = schedule()
        decode = sum(c.num_tokens for c in plan.chunks if c.seq.in_decode)
        chunks = [c.num_tokens for c in plan.chunks if not c.seq.in_decode]
        plans.append((decode, plan.num_tokens - decode, chunks))
        return plan

    engine.scheduler.schedule = spy
    engine.step()
    engine.step()
    for i in range(n_long):
        prompt = [rng.randrange(5, vocab) for _ in range(long_len)]
        reqs.append(engine.add_request(prompt, params, request_id=f"l{i}"))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
    return plans, outs


@pytest.mark.parametrize("cap", [8, 24])
def test_prompt_tokens_are_capped_while_decodes_run(tiny_llama, cap):
    free_plans, free_outs = _drive(_engine(tiny_llama, None))
    plans, outs = _drive(_engine(tiny_llama, cap))
    assert outs == free_outs and len(outs) == 4
    chunks_with_decodes = [c for d, _, chunks in plans if d > 0 for c in chunks]
    assert chunks_with_decodes and max(chunks_with_decodes) <= cap, plans
    assert max(c for d, _, chunks in free_plans if d > 0 for c in chunks) > cap, (
        "uncapped, a long prompt fills the budget"
    )
    # Both long prompts progress in the same steps (per prompt, not one prompt per step).
    assert any(d > 0 and len(chunks) == 2 for d, _, chunks in plans), plans
    # No decode in the step (the very first one): the whole budget, not the cap.
    assert plans[0][:2] == (0, 8)
    assert len(plans) > len(free_plans), "capped prefills take more steps"


def test_a_burst_of_short_prompts_joins_one_step_beside_decodes(tiny_llama):
    """Six 10-token prompts arrive while two streams decode (cap 24, budget 64): all six are
    prefilled in the next step (60 prompt tokens), so the two streams wait once, not six times.
    A per-step cap (the old meaning) would take two prompts a step over three steps."""
    plans, outs = _drive(_engine(tiny_llama, 24), n_long=6, long_len=10)
    free_plans, free_outs = _drive(_engine(tiny_llama, None), n_long=6, long_len=10)
    assert outs == free_outs and len(outs) == 8
    mixed = [(d, p, chunks) for d, p, chunks in plans if d > 0 and p > 0]
    assert mixed == [(2, 60, [10] * 6)], plans


def test_cap_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="max_prefill_tokens_with_decodes"):
        EngineConfig(model=tiny_llama, max_prefill_tokens_with_decodes=0)
