"""prefill_tokens_per_decode: while N sequences decode and W wait, a step adds at most (N + W) x
per-decode prompt tokens (rounded up to the scheduler's quantum, at least its minimum), cutting a
prompt's chunk to fit; with nothing decoding it does not apply (a burst's first step is the
prefill group's). Counted
on the scheduler's plans; greedy outputs equal the unlimited engine's (float32 on the torch backend:
chunking does not change a row's numbers); off (0) unless set."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.scheduler import PROMPT_ROOM_MIN, PROMPT_ROOM_QUANTUM, prompt_room


def _engine(model: str, per_decode: int, **kw) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model,
            **{
                "max_num_seqs": 48,
                "max_num_batched_tokens": 1024,
                "max_prefill_tokens_with_decodes": 128,
                "prefill_group_tokens": 0,
                "prefill_tokens_per_decode": per_decode,
                "block_size": 8,
                "num_kv_blocks": 1024,
                "kernel_backend": "torch",
                "dtype": "float32",
                "scheduling_policy": "fcfs",
                **kw,
            },
        )
    )


def _run(engine: LLMEngine, running: int, later: list[int], steps_between: int = 2):
    """``running`` 8-token prompts start and decode for ``steps_between`` steps, then prompts of
    ``later`` lengths arrive together. Returns per step (decode rows, prompt chunk sizes, requests
    waiting before the plan) from the arrival on, and every request's tokens."""
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i in range(running):
        engine.add_request([rng.randrange(5, vocab) for _ in range(8)], params, request_id=f"d{i}")
    plans: list[tuple[int, list[int], int]] = []
    schedule = engine.scheduler.schedule

    def spy():
        waiting = engine.scheduler.policy.num_waiting()
        plan = schedule()
        decodes = sum(1 for c in plan.chunks if c.seq.in_decode)
        plans.append((decodes, [c.num_tokens for c in plan.chunks if not c.seq.in_decode], waiting))
        return plan

    engine.scheduler.schedule = spy
    outs: dict[str, list[int]] = {}

    def step():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = list(out.outputs[0].token_ids)

    for _ in range(1 + steps_between):
        step()
    arrival = len(plans)
    for i, n in enumerate(later):
        engine.add_request([rng.randrange(5, vocab) for _ in range(n)], params, request_id=f"p{i}")
    while engine.has_unfinished_requests():
        step()
    return plans[arrival:], outs


def test_room_grows_with_the_decodes_and_the_waiting():
    assert prompt_room(0, 0, 3) is None and prompt_room(0, 64, 3) is None and prompt_room(16, 0, 0) is None
    assert prompt_room(1, 0, 3) == PROMPT_ROOM_MIN == 32
    assert prompt_room(16, 0, 3) == 48 and prompt_room(15, 1, 3) == 48
    assert prompt_room(17, 0, 3) == 48 + PROMPT_ROOM_QUANTUM
    assert prompt_room(64, 0, 3) == 192 == prompt_room(2, 62, 3)  # a burst is admitted as fast
    assert prompt_room(62, 0, 4) == 256
    assert all(prompt_room(d, w, 3) % PROMPT_ROOM_QUANTUM == 0 for d in range(1, 80) for w in range(5))
    rooms = [prompt_room(d, 0, 3) for d in range(1, 100)]
    assert rooms == sorted(rooms)


def test_a_prompt_beside_sixteen_decodes_is_chunked_to_the_room(tiny_llama):
    """16 streams decode when a 150-token prompt arrives: at 3 per stream it is prefilled 64 (17
    share the first step: the streams and the prompt itself, waiting), 48, 38 tokens a step (the
    chunk cap alone, 128, takes it in 128 + 22), every step with all 16 decodes; greedy tokens equal
    the unlimited engine's."""
    plans, outs = _run(_engine(tiny_llama, 3), 16, [150])
    free_plans, free_outs = _run(_engine(tiny_llama, 0), 16, [150])
    assert [chunks for _, chunks, _ in plans[:3]] == [[64], [48], [38]], plans[:4]
    assert [prompt_room(d, w, 3) for d, _, w in plans[:2]] == [64, 48]
    assert all(d == 16 for d, _, _ in plans[:3]), plans[:4]
    assert [chunks for _, chunks, _ in free_plans[:2]] == [[128], [22]], free_plans[:3]
    assert outs == free_outs and len(outs) == 17


def test_prompts_arriving_together_share_the_room(tiny_llama):
    """40 streams decode when four 70-token prompts arrive (room (40 + 4) x 4 = 176): the step's
    prompt tokens never exceed the room, the prompt that does not fit is cut (its rest goes on the
    next step before new admissions), and all 280 tokens are prefilled in two steps."""
    plans, outs = _run(_engine(tiny_llama, 4, max_num_seqs=64), 40, [70, 70, 70, 70])
    prompt_steps = [(d, chunks, w) for d, chunks, w in plans if chunks]
    assert all(sum(chunks) <= prompt_room(d, w, 4) for d, chunks, w in prompt_steps), prompt_steps
    assert prompt_steps[0] == (40, [70, 70, 36], 4), prompt_steps
    assert prompt_steps[1][1] == [34, 70], prompt_steps
    assert sum(sum(c) for _, c, _ in prompt_steps) == 280 and len(prompt_steps) == 2, prompt_steps
    _, free_outs = _run(_engine(tiny_llama, 0, max_num_seqs=64), 40, [70, 70, 70, 70])
    assert outs == free_outs


def test_no_room_limit_without_decodes(tiny_llama):
    """A burst with nothing decoding (the first step) is not limited by the room: the whole burst
    goes in one step (no prefill group here), as with the room off."""
    engine = _engine(tiny_llama, 3)
    plans, _ = _run(engine, 0, [100, 100, 100], steps_between=0)
    assert plans[0][:2] == (0, [100, 100, 100]), plans[:2]


def test_room_is_validated(tiny_llama):
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="prefill_tokens_per_decode"):
            EngineConfig(model=tiny_llama, prefill_tokens_per_decode=bad)
    with pytest.raises(ValueError, match="prefill_tokens_per_decode"):
        EngineConfig.check(prefill_tokens_per_decode=-1)


def test_room_is_off_by_default(tiny_llama):
    """Off unless set: measured over HTTP, no value helps both targets at 16 clients (the
    throughput it costs there, docs/cpu-performance.md "Prompt room by decodes")."""
    assert EngineConfig(model=tiny_llama).prefill_tokens_per_decode == 0
    assert EngineConfig(model=tiny_llama, dtype="bfloat16", prefill_tokens_per_decode=5).prefill_tokens_per_decode == 5
