"""prefill_group_tokens: waiting prompts stop joining a step once it carries that many prompt tokens, so
a burst is prefilled a group at a time and its first prompts get their first token steps earlier;
a prompt is never cut for it (a long prompt alone keeps its one-step prefill); unset, it is sized
from the CPU kind (kernels/cpu_packed.PREFILL_GROUP_TOKENS) for bf16 models on the packed linears
and is 0 (off) elsewhere. Counted on the scheduler's plans; greedy outputs equal the ungrouped
engine's (float32 on the torch backend: the batch composition does not change a row's numbers)."""

from __future__ import annotations

import random

import pytest
import torch

from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine
from loraplex.kernels import cpu_packed


def _engine(model: str, group: int) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            prefill_group_tokens=group,
            block_size=8,
            num_kv_blocks=256,
            kernel_backend="torch",
            dtype="float32",
            scheduling_policy="fcfs",
        )
    )


def _burst(engine: LLMEngine, lengths: list[int]) -> tuple[list[tuple[int, list[int]]], dict[str, int], dict]:
    """All prompts arrive together. Returns per step (decode rows, prompt chunk sizes), the step at
    which each request got its first token, and each request's tokens."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i, n in enumerate(lengths):
        engine.add_request([rng.randrange(5, vocab) for _ in range(n)], params, request_id=f"r{i}")
    plans: list[tuple[int, list[int]]] = []
    schedule = engine.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append(
            (sum(1 for c in plan.chunks if c.seq.in_decode), [c.num_tokens for c in plan.chunks if not c.seq.in_decode])
        )
        return plan

    engine.scheduler.schedule = spy
    first: dict[str, int] = {}
    outs: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        for out in engine.step():
            if out.outputs[0].token_ids and out.request_id not in first:
                first[out.request_id] = step
            if out.finished:
                outs[out.request_id] = list(out.outputs[0].token_ids)
    return plans, first, outs


def test_a_burst_is_prefilled_a_group_at_a_time(tiny_llama):
    """Eight 40-token prompts, group 80: two prompts a step, where the budget (512) alone takes all
    eight in one 320-token step; the first pair has its first token after an 80-token step instead
    of after the whole burst."""
    lengths = [40] * 8
    plans, first, outs = _burst(_engine(tiny_llama, 80), lengths)
    free_plans, free_first, free_outs = _burst(_engine(tiny_llama, 0), lengths)
    assert outs == free_outs and len(outs) == 8
    assert free_plans[0] == (0, [40] * 8), "ungrouped, the whole burst is one step"
    prompt_steps = [chunks for _, chunks in plans if chunks]
    assert prompt_steps == [[40, 40]] * 4, plans
    assert sorted(first.values()) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert set(free_first.values()) == {1}
    # Decodes of the first groups run beside the later groups' prefills.
    assert [d for d, chunks in plans[1:4]] == [2, 4, 6], plans


def test_a_long_prompt_is_not_cut_by_the_group(tiny_llama):
    """One 300-token prompt with group 80: admitted whole in one step (the group only stops FURTHER
    prompts from joining); the short prompt that arrived with it waits one step."""
    plans, first, outs = _burst(_engine(tiny_llama, 80), [300, 20])
    assert plans[0] == (0, [300]), plans
    assert plans[1] == (1, [20]), plans
    assert first == {"r0": 1, "r1": 2}
    _, _, free_outs = _burst(_engine(tiny_llama, 0), [300, 20])
    assert outs == free_outs


def test_uneven_prompts_fill_a_group_then_stop(tiny_llama):
    """Group 64: prompts join while the step holds fewer than 64 prompt tokens (30 + 30 + 30 = 90:
    the third starts below 64 and is not cut)."""
    plans, _, _ = _burst(_engine(tiny_llama, 64), [30, 30, 30, 30, 10])
    prompt_steps = [chunks for _, chunks in plans if chunks]
    assert prompt_steps[0] == [30, 30, 30], plans
    assert prompt_steps[1] == [30, 10], plans


def test_group_is_validated(tiny_llama):
    for bad in (-1, 1.5, True, "256"):
        with pytest.raises(ValueError, match="prefill_group_tokens"):
            EngineConfig(model=tiny_llama, prefill_group_tokens=bad)
    with pytest.raises(ValueError, match="prefill_group_tokens"):
        EngineConfig.check(prefill_group_tokens=-5)
    EngineConfig.check(prefill_group_tokens=None)  # unset = sized at start


def test_unset_group_is_sized_from_the_cpu_kind(tiny_llama):
    """float32 and the torch backend (the oracle) are not grouped; a bf16 model on the native
    backend takes the measured size of this CPU's kind (0 where bf16 is not packed here)."""
    assert EngineConfig(model=tiny_llama, dtype="float32", kernel_backend="cpu").prefill_group_tokens == 0
    assert EngineConfig(model=tiny_llama, dtype="bfloat16", kernel_backend="torch").prefill_group_tokens == 0
    want = cpu_packed.prefill_group_tokens(torch.bfloat16)
    assert EngineConfig(model=tiny_llama, dtype="bfloat16", kernel_backend="cpu").prefill_group_tokens == want
    assert EngineConfig(model=tiny_llama, dtype="bfloat16", prefill_group_tokens=96).prefill_group_tokens == 96


def test_group_per_kind_mapping():
    assert cpu_packed.prefill_group_tokens(torch.float32, "amx") == 0
    assert cpu_packed.prefill_group_tokens(torch.bfloat16, "none") == 0
    for kind in ("amx", "avx512_bf16"):
        want = cpu_packed.PREFILL_GROUP_TOKENS[kind] if cpu_packed.onednn_bf16() else 0
        assert cpu_packed.prefill_group_tokens(torch.bfloat16, kind) == want
    assert all(v >= 0 for v in cpu_packed.PREFILL_GROUP_TOKENS.values())
    assert set(cpu_packed.PREFILL_GROUP_TOKENS) == set(cpu_packed.KINDS)
