"""The per-prompt prefill cap under a hostile burst, in process: many long prompts arriving together
while streams decode, mixed with n > 1 (seeded sampling), several adapters (more than max_loras),
shared prefixes (the prefix cache) and a KV cache small enough that admissions preempt. The cap only
changes how prompts are chunked, so every request's tokens (every choice) must equal those of the
uncapped engine, and every request must finish."""

from __future__ import annotations

import random

import pytest
from lora_testlib import ADAPTER_SPECS, make_adapters

from loraplex.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def base(model_factory) -> str:
    return model_factory("llama_gqa")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory) -> dict[str, str]:
    return make_adapters(base, tmp_path_factory.mktemp("cap_burst_adapters"), dict(ADAPTER_SPECS))


def _run(base: str, adapters: dict[str, str], cap: int | None, num_kv_blocks: int) -> tuple[dict, list]:
    llm = LLM(
        model=base,
        dtype="float32",
        kernel_backend="torch",
        max_num_seqs=16,
        max_num_batched_tokens=96,
        max_prefill_tokens_with_decodes=cap,
        block_size=8,
        num_kv_blocks=num_kv_blocks,
        max_loras=2,
        max_lora_rank=16,
        scheduling_policy="fcfs",
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    names = [None, *adapters]
    rng = random.Random(3)
    shared = [rng.randrange(5, vocab) for _ in range(40)]
    plans: list[tuple[int, list[int], int]] = []
    schedule = engine.scheduler.schedule

    def spy():
        plan = schedule()
        plans.append(
            (
                sum(1 for c in plan.chunks if c.seq.in_decode),
                [c.num_tokens for c in plan.chunks if not c.seq.in_decode],
                len(plan.preempted),
            )
        )
        return plan

    engine.scheduler.schedule = spy
    for i in range(3):  # streams that decode while the burst arrives
        engine.add_request(
            [rng.randrange(5, vocab) for _ in range(5)],
            SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
            request_id=f"s{i}",
            adapter=names[i % len(names)],
        )
    outs: dict[str, list[list[int]]] = {}

    def step():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = [c.token_ids for c in sorted(out.outputs, key=lambda c: c.index)]

    for _ in range(3):
        step()
    for i in range(14):  # the burst: long prompts, some sharing a prefix, n = 3 on some
        length = rng.randrange(60, 200)
        prompt = (shared if i % 3 == 0 else []) + [rng.randrange(5, vocab) for _ in range(length)]
        n = 3 if i % 4 == 1 else 1
        params = SamplingParams(max_tokens=12, temperature=1.0 if n > 1 else 0.0, seed=100 + i, n=n, ignore_eos=True)
        engine.add_request(prompt, params, request_id=f"b{i}", adapter=names[i % len(names)])
    guard = 0
    while engine.has_unfinished_requests():
        step()
        guard += 1
        assert guard < 5000, "the engine did not drain"
    return outs, plans


@pytest.mark.parametrize(("cap", "num_kv_blocks"), [(16, 90), (50, 400)])
def test_a_burst_gives_the_same_tokens_capped_or_not(base, adapters, cap, num_kv_blocks):
    free, _ = _run(base, adapters, None, num_kv_blocks)
    capped, plans = _run(base, adapters, cap, num_kv_blocks)
    assert len(free) == 17 and set(capped) == set(free)
    for rid in free:
        assert capped[rid] == free[rid], rid
        assert all(len(toks) == (40 if rid.startswith("s") else 12) for toks in capped[rid]), rid
    # While decodes run, no chunk is over the cap, and the burst's prompts share steps.
    with_decodes = [chunks for decodes, chunks, _ in plans if decodes]
    assert max(max(c, default=0) for c in with_decodes) <= cap
    assert max(len(c) for c in with_decodes) >= 2
    # The small cache really preempts (prompts admitted together run it out), the large one does not.
    preempted = sum(p for _, _, p in plans)
    assert (preempted > 0) == (num_kv_blocks == 90), preempted
