"""Host-tier prefetch: a queued request's adapter is read from disk on a background thread while
the engine steps; the step that needs it takes the finished copy (no disk read on the step), and
outputs stay exactly the PEFT oracle's."""

from __future__ import annotations

import time

import pytest
from lora_testlib import ADAPTER_SPECS, PeftOracle, make_adapters, make_prompts

from loraplex.engine import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def base(model_factory) -> str:
    return model_factory("llama_gqa")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory) -> dict[str, str]:
    return make_adapters(base, tmp_path_factory.mktemp("prefetch_adapters"), dict(ADAPTER_SPECS))


def _llm(base: str, max_cpu_loras: int) -> LLM:
    return LLM(
        model=base,
        dtype="float32",
        kernel_backend="torch",
        max_num_seqs=4,
        max_num_batched_tokens=32,
        block_size=4,
        max_loras=1,
        max_cpu_loras=max_cpu_loras,
        max_lora_rank=16,
    )


def test_queued_adapter_is_prefetched_off_the_step(base, adapters):
    llm = _llm(base, max_cpu_loras=1)
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    lora = llm.engine.lora
    names = list(adapters)
    cold = next(n for n in names if not lora.host_ready(n) or n not in lora.stats()["cpu_cached"])
    assert cold not in lora.stats()["cpu_cached"]  # one host copy: the others were evicted
    disk_before = lora.counters["disk_loads"]
    lora.on_request_added(cold)  # what queuing a request does
    assert lora.counters["prefetches"] == 1
    lora.on_request_added(cold)  # a second request: no second load
    assert lora.counters["prefetches"] == 1
    deadline = time.monotonic() + 120
    while not lora.host_ready(cold):
        assert time.monotonic() < deadline, "prefetch never finished"
        time.sleep(0.05)
    lora.prepare({cold})
    assert lora.counters["prefetch_ready"] == 1 and lora.counters["prefetch_waits"] == 0
    assert lora.counters["disk_loads"] == disk_before + 1  # the prefetched copy, not a second read
    assert cold in lora.stats()["cpu_cached"]
    lora.on_request_finished(cold)
    lora.on_request_finished(cold)


def test_outputs_match_the_oracle_with_prefetch_and_a_tiny_host_cache(base, adapters):
    oracle = PeftOracle(base, adapters)
    llm = _llm(base, max_cpu_loras=1)
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    names = list(adapters)
    assign = [names[i % len(names)] for i in range(8)]
    prompts = make_prompts(len(assign), llm.engine.model_config.vocab_size, seed=5)
    outs = llm.generate(prompts, GREEDY, adapters=assign)
    for prompt, adapter, out in zip(prompts, assign, outs):
        assert out.token_ids == oracle.greedy(prompt, adapter, 5), adapter
    c = llm.engine.lora.counters
    assert c["prefetches"] >= 1
    assert c["prefetch_ready"] + c["prefetch_waits"] <= c["prefetches"]


def test_identical_content_re_added_while_draining_stays_registered(base, adapters):
    """The platform re-adds an adapter whose cached files were evicted and fetched again: same
    content, same name, while its earlier requests still run."""
    llm = _llm(base, max_cpu_loras=2)
    engine = llm.engine
    path = next(iter(adapters.values()))
    llm.add_adapter("x", path)
    first = engine.add_request([5, 6, 7], GREEDY, adapter="x")
    engine.step()
    llm.remove_adapter("x")
    assert "x" not in engine.lora.list_adapters() and engine.lora.stats()["draining"] == ["x"]
    llm.add_adapter("x", path)
    assert "x" in engine.lora.list_adapters() and engine.lora.stats()["draining"] == []
    second = engine.add_request([1, 2], GREEDY, adapter="x")
    while engine.has_unfinished_requests():
        engine.step()
    assert first.error is None and second.error is None
    assert len(second.sequences[0].output_token_ids) == 5
    assert "x" in engine.lora.list_adapters()  # not dropped when the first request finished
