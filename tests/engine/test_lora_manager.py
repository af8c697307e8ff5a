"""LoRAManager tiers and lifecycle: eviction through host cache and device slots, removal while
requests run, re-registration as a new version, lazy slots, and the AsyncEngine adapter field."""

from __future__ import annotations

import asyncio

import pytest
from lora_testlib import ADAPTER_SPECS, ATTN, MLP, PeftOracle, make_adapters, make_peft_adapter, make_prompts

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.config import EngineConfig
from loraplex.engine.errors import InvalidRequestError, UnknownAdapterError
from loraplex.engine.lora import AdapterNotFoundError

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def base(model_factory) -> str:
    return model_factory("llama_gqa")


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory) -> dict[str, str]:
    specs = dict(ADAPTER_SPECS)
    specs["extra_r3"] = dict(r=3, lora_alpha=9, target_modules=["k_proj", "o_proj", "gate_proj"])
    return make_adapters(base, tmp_path_factory.mktemp("mgr_adapters"), specs)


@pytest.fixture(scope="module")
def oracle(base, adapters) -> PeftOracle:
    return PeftOracle(base, adapters)


@pytest.mark.slow
def test_more_adapters_than_slots_and_cache_cycle_correctly(base, adapters, oracle):
    llm = LLM(
        model=base,
        dtype="float32",
        kernel_backend="torch",
        max_num_seqs=6,
        max_num_batched_tokens=32,
        block_size=4,
        max_loras=2,
        max_cpu_loras=3,
        max_lora_rank=16,
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    names = list(adapters)
    assign = [names[i % len(names)] if i % 5 else None for i in range(14)]
    prompts = make_prompts(len(assign), llm.engine.model_config.vocab_size, seed=3)
    seen: list[int] = []
    prepare = llm.engine.lora.prepare
    llm.engine.lora.prepare = lambda ns: (seen.append(len(ns)), prepare(ns))[1]
    for round_ in range(2):  # the second round starts from a cold-ish cache state
        outs = llm.generate(prompts, GREEDY, adapters=assign)
        for i, (prompt, adapter, out) in enumerate(zip(prompts, assign, outs)):
            assert out.token_ids == oracle.greedy(prompt, adapter, 6), f"round {round_} request {i} ({adapter})"
    stats = llm.engine.stats()["lora"]
    assert max(seen) == 2  # max_loras honoured every step, and used
    assert stats["slot_evictions"] > 0 and stats["cpu_evictions"] > 0
    assert stats["disk_loads"] > len(adapters)  # evicted host copies were re-read from disk
    assert len(stats["cpu_cached"]) <= 3 and len(stats["resident"]) <= 2


def test_base_only_serving_allocates_no_slots(base):
    llm = LLM(model=base, dtype="float32", kernel_backend="torch")
    llm.generate([[5, 6, 7]], GREEDY)
    proj = llm.engine.runner.model.layers[0].self_attn.qkv_proj
    assert proj.lora_a is None and not llm.engine.lora.slots_allocated


def test_remove_adapter_lets_running_requests_finish(base, adapters, oracle):
    llm = LLM(model=base, dtype="float32", kernel_backend="torch", max_loras=2, max_cpu_loras=2)
    engine = llm.engine
    llm.add_adapter("x", adapters["attn_r8"])
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    reqs = [engine.add_request(p, GREEDY, adapter="x") for p in prompts]
    engine.step()
    llm.remove_adapter("x")
    assert "x" not in llm.engine.lora.list_adapters()
    with pytest.raises(UnknownAdapterError):
        engine.add_request([1, 2], GREEDY, adapter="x")
    with pytest.raises(InvalidRequestError, match="still use it"):
        llm.add_adapter("x", adapters["mlp_r4"])  # would share the name with the draining version
    assert engine.lora.stats()["draining"] == ["x"]
    while engine.has_unfinished_requests():
        engine.step()
    for p, r in zip(prompts, reqs):
        assert r.error is None and r.sequences[0].output_token_ids == oracle.greedy(p, "attn_r8", 6)
    stats = engine.lora.stats()
    assert stats["draining"] == [] and stats["cpu_cached"] == [] and stats["resident"] == {}
    with pytest.raises(AdapterNotFoundError):
        llm.remove_adapter("x")
    with pytest.raises(KeyError):  # dict-like callers may catch KeyError
        llm.remove_adapter("never-added")


def test_reupload_under_same_name_never_serves_stale_weights(base, adapters, oracle, tmp_path):
    llm = LLM(model=base, dtype="float32", kernel_backend="torch", max_loras=2, max_cpu_loras=2)
    prompt = [5, 6, 7, 8, 9]
    llm.add_adapter("tenant-ft", adapters["attn_r8"])
    assert llm.generate([prompt], GREEDY, adapters=["tenant-ft"])[0].token_ids == oracle.greedy(prompt, "attn_r8", 6)
    assert llm.engine.lora.stats()["resident"] == {0: "tenant-ft"}
    # Same content again: a no-op that keeps the version.
    llm.add_adapter("tenant-ft", adapters["attn_r8"])
    assert llm.engine.lora.stats()["slot_loads"] == 1
    # New content under the same name (and even the same path): a new version, reloaded.
    path = tmp_path / "reupload"
    import shutil

    shutil.copytree(adapters["all_r16_rslora"], path)
    llm.add_adapter("tenant-ft", str(path))
    assert llm.generate([prompt], GREEDY, adapters=["tenant-ft"])[0].token_ids == oracle.greedy(
        prompt, "all_r16_rslora", 6
    )
    # Files swapped on disk behind the registry's back are refused on reload, not served stale.
    shutil.rmtree(path)
    shutil.copytree(adapters["mlp_r4"], path)
    llm.engine.lora.host.clear()  # both copies forgotten: the next step reads the files again
    llm.engine.lora.slots.clear()
    out = llm.generate([prompt], GREEDY, adapters=["tenant-ft"])[0]
    assert out.error is not None and "changed since they were registered" in out.error
    assert llm.generate([prompt], GREEDY)[0].error is None  # and the engine keeps serving


def test_async_engine_adapter_field(base, adapters, oracle):
    engine = AsyncEngine(
        EngineConfig(model=base, dtype="float32", kernel_backend="torch", max_loras=2, max_cpu_loras=2)
    ).start()
    try:
        engine.add_adapter("mlp", adapters["mlp_r4"])
        assert engine.list_adapters() == ["mlp"]

        async def run():
            a = engine.generate([5, 6, 7], GREEDY, adapter="mlp")
            b = engine.generate([5, 6, 7], GREEDY)
            return await asyncio.gather(a, b)

        with_adapter, without = asyncio.run(run())
        assert with_adapter.outputs[0].token_ids == oracle.greedy([5, 6, 7], "mlp_r4", 6)
        assert without.outputs[0].token_ids == oracle.greedy([5, 6, 7], None, 6)
        assert with_adapter.adapter == "mlp"

        async def unknown():
            engine.submit([1, 2], GREEDY, adapter="nope")

        with pytest.raises(UnknownAdapterError):
            asyncio.run(unknown())
        engine.remove_adapter("mlp")
        assert engine.stats()["lora"]["registered"] == []
    finally:
        engine.shutdown()


def test_mixed_ranks_targets_fit_max_lora_rank(base, tmp_path):
    """rank == max_lora_rank is accepted and served."""
    path = make_peft_adapter(base, tmp_path / "r16", r=16, lora_alpha=16, target_modules=ATTN + MLP)
    llm = LLM(model=base, dtype="float32", kernel_backend="torch", max_loras=1, max_cpu_loras=1, max_lora_rank=16)
    llm.add_adapter("r16", path)
    assert llm.generate([[5, 6]], GREEDY, adapters=["r16"])[0].error is None
