"""max_prefill_tokens_with_decodes: while sequences decode, a step carries at most that many prompt
tokens (new admissions and continuing prefills together), so a long prompt arriving does not stall
the running streams for one huge step; without decodes the whole token budget is used. Counted on
the scheduler's plans, and the outputs are the same tokens either way (greedy)."""

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


def _drive(engine: LLMEngine) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """Two short prompts start decoding, then two long ones arrive. Returns per step (decode
    tokens, prompt tokens) and each request's output."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request([rng.randrange(5, vocab) for _ in range(4)], params, request_id=f"s{i}") for i in (0, 1)]
    plans: list[tuple[int, int]] = []
    outs: dict[str, list[int]] = {}
    schedule = engine.scheduler.schedule

    def spy():
        plan = schedule()
        decode = sum(c.num_tokens for c in plan.chunks if c.seq.in_decode)
        plans.append((decode, plan.num_tokens - decode))
        return plan

    engine.scheduler.schedule = spy
    engine.step()
    engine.step()
    for i in (0, 1):
        reqs.append(engine.add_request([rng.randrange(5, vocab) for _ in range(100)], params, request_id=f"l{i}"))
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
    with_decodes = [p for d, p in plans if d > 0]
    assert max(with_decodes) <= cap and sum(with_decodes) > 0
    assert max(p for d, p in free_plans if d > 0) > cap, "uncapped, the long prompts fill the budget"
    # No decode in the step (the very first one): the whole budget, not the cap.
    assert plans[0] == (0, 8)
    assert len(plans) > len(free_plans), "capped prefills take more steps"


def test_cap_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="max_prefill_tokens_with_decodes"):
        EngineConfig(model=tiny_llama, max_prefill_tokens_with_decodes=0)
