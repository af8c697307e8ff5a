"""benchmarks/engine/itl.py's per-step log, the evidence its ITL table rests on: every step's prompt
tokens and decode rows are recorded as the scheduler planned them, so a prefill cap shows as the
largest prompt-token count beside decodes, and every generated token after the first is one
inter-token gap."""

from __future__ import annotations

import random

import pytest

from benchmarks.engine import itl
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine


@pytest.mark.parametrize("cap", [None, 8])
def test_step_log_counts_gaps_and_sees_the_cap(tiny_llama, cap):
    engine = LLMEngine(
        EngineConfig(
            model=tiny_llama,
            dtype="float32",
            kernel_backend="torch",
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_prefill_tokens_with_decodes=cap,
            block_size=8,
            num_kv_blocks=256,
            scheduling_policy="fcfs",
        )
    )
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    prompts = [[rng.randrange(5, vocab) for _ in range(30)] for _ in range(6)]
    res = itl.run_once(engine, prompts, concurrency=3, tokens=5)
    # 6 requests x 5 tokens, the first of each is TTFT: 6 x 4 gaps.
    assert res["gaps"] == 6 * 4
    assert res["steps"] >= 6 * 5 // 3
    # Requests arrive while others decode (3 in flight, each replaced when it finishes).
    assert res["mixed_steps"] > 0
    if cap is None:
        assert res["max_prompt_tok_with_decodes"] > 8, "uncapped, a 30-token prompt lands beside decodes"
    else:
        # The cap is per prompt: with 3 in flight, at most 2 prompts join a step that decodes.
        assert 0 < res["max_prompt_tok_with_decodes"] <= 2 * cap
    assert res["itl_p99_ms"] >= res["itl_p50_ms"] > 0
    assert not hasattr(engine.scheduler, "__dict__") or "schedule" not in engine.scheduler.__dict__, (
        "the scheduler's own schedule() is restored after the run"
    )
