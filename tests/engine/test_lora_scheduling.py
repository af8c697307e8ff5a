"""The scheduler's adapter limit: <= max_loras distinct adapters per step, a blocked adapter is
skipped without blocking the requests behind it, and it cannot starve."""

from __future__ import annotations

import pytest
from lora_testlib import make_peft_adapter

from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.scheduler import LORA_MAX_BLOCKED_STEPS
from loraplex.engine.sequence import SequenceStatus


@pytest.fixture(scope="module")
def base(model_factory) -> str:
    return model_factory("llama_gqa")


@pytest.fixture(scope="module")
def two_adapters(base, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sched_adapters")
    return {
        n: make_peft_adapter(base, root / n, seed=i, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
        for i, n in enumerate(["A", "B"])
    }


def _engine(base: str, adapters: dict[str, str], **kw) -> tuple[LLMEngine, list[set[str]]]:
    engine = LLMEngine(EngineConfig(model=base, dtype="float32", kernel_backend="torch", block_size=4, **kw))
    for name, path in adapters.items():
        engine.lora.add_adapter(name, path)
    seen: list[set[str]] = []
    prepare = engine.lora.prepare

    def recording_prepare(names):  # instrument: every step's adapters
        seen.append(set(names))
        return prepare(names)

    engine.lora.prepare = recording_prepare
    return engine, seen


def _status(engine: LLMEngine, req) -> SequenceStatus:
    return req.sequences[0].status


def test_blocked_adapter_is_skipped_without_blocking_others(base, two_adapters):
    engine, seen = _engine(base, two_adapters, max_loras=1, max_cpu_loras=2, max_num_seqs=8)
    p = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    a1 = engine.add_request([5, 6, 7], p, adapter="A")
    engine.step()
    b = engine.add_request([8, 9, 10], p, adapter="B")  # no free slot: A holds the only one
    base_req = engine.add_request([11, 12], p)
    a2 = engine.add_request([13, 14, 15], p, adapter="A")
    engine.step()
    assert _status(engine, b) is SequenceStatus.WAITING
    assert _status(engine, base_req) is SequenceStatus.RUNNING  # behind B, yet admitted
    assert _status(engine, a2) is SequenceStatus.RUNNING
    assert _status(engine, a1) is SequenceStatus.RUNNING
    while engine.has_unfinished_requests():
        engine.step()
    assert all(len(s) <= 1 for s in seen)
    assert b.sequences[0].finish_reason == "length"


def test_blocked_adapter_cannot_starve(base, two_adapters):
    """A steady stream of adapter-A requests would keep A's slot busy forever; B must still run."""
    engine, seen = _engine(base, two_adapters, max_loras=1, max_cpu_loras=2, max_num_seqs=4)
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request([5, 6, 7], p, adapter="A")
    engine.step()
    b = engine.add_request([8, 9, 10], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), adapter="B")
    steps = 0
    while not b.finished:
        engine.add_request([20 + steps % 50, 21, 22], p, adapter="A")  # a new A request every step
        engine.step()
        steps += 1
        assert steps < 200, "adapter B starved"
    # Frozen after LORA_MAX_BLOCKED_STEPS, then A's running requests (<= 6 tokens) drain.
    assert steps <= LORA_MAX_BLOCKED_STEPS + 6 + 3 + 3, steps
    assert b.error is None
    assert all(len(s) <= 1 for s in seen)
    assert {"B"} in seen
    while engine.has_unfinished_requests():  # the A stream resumes afterwards
        engine.step()
    assert engine.stats()["lora"]["active_requests"] == {}


def test_base_requests_flow_while_adapters_are_frozen(base, two_adapters):
    engine, seen = _engine(base, two_adapters, max_loras=1, max_cpu_loras=2, max_num_seqs=8)
    p = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    engine.add_request([5, 6, 7], p, adapter="A")
    engine.step()
    engine.add_request([8, 9], p, adapter="B")
    for _ in range(LORA_MAX_BLOCKED_STEPS + 1):
        engine.step()
    assert engine.scheduler._starving_adapter() == "B"
    base_req = engine.add_request([1, 2, 3], p)
    a_late = engine.add_request([1, 2, 4], p, adapter="A")
    engine.step()
    assert _status(engine, base_req) is SequenceStatus.RUNNING
    assert _status(engine, a_late) is SequenceStatus.WAITING  # frozen until B gets its slot
    while engine.has_unfinished_requests():
        engine.step()
    assert all(len(s) <= 1 for s in seen)
