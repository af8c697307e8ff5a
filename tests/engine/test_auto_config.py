"""`auto` engine settings resolve to concrete values: dtype from the device and the CPU's bf16
support, KV memory and batch size from free memory; the resolved config reports what runs."""

from __future__ import annotations

import torch

from loraplex.engine import LLM, EngineConfig
from loraplex.engine.config import cpu_has_native_bf16, resolve_dtype
from loraplex.engine.describe import resolved_config
from loraplex.engine.memory import CPU_KV_MAX_GB, CPU_KV_MIN_GB, MAX_SEQS


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next(set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags"))


def test_dtype_auto_follows_the_device_and_the_cpu():
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu, torch.bfloat16) is torch.float32  # explicit always wins
    assert resolve_dtype("bfloat16", cpu, None) is torch.bfloat16
    native = bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})
    assert cpu_has_native_bf16() is native
    expected = torch.bfloat16 if native else torch.float32
    for checkpoint in (torch.float32, torch.bfloat16, None):
        assert resolve_dtype("auto", cpu, checkpoint) is expected


def test_kv_memory_and_batch_sized_when_unset(tiny_llama):
    auto = EngineConfig(model=tiny_llama)
    assert CPU_KV_MIN_GB <= auto.kv_cache_memory_gb <= CPU_KV_MAX_GB
    assert 4 <= auto.max_num_seqs <= MAX_SEQS["cpu"]
    # A pool fixed by the caller: the batch is capped by the device only, the memory is not used.
    fixed = EngineConfig(model=tiny_llama, num_kv_blocks=32)
    assert fixed.max_num_seqs == MAX_SEQS["cpu"] and fixed.kv_cache_memory_gb is None
    explicit = EngineConfig(model=tiny_llama, max_num_seqs=3, kv_cache_memory_gb=0.01)
    assert (explicit.max_num_seqs, explicit.kv_cache_memory_gb) == (3, 0.01)


def test_resolved_config_reports_what_runs(tiny_llama):
    llm = LLM(model=tiny_llama, dtype="float32", kv_cache_memory_gb=0.01, max_num_seqs=5)
    got = resolved_config(llm.engine)
    assert got["dtype"] == "float32" and got["device"] == "cpu" and got["max_num_seqs"] == 5
    assert got["enable_prefix_caching"] is True  # the default
    assert got["num_kv_blocks"] == llm.engine.kv.num_blocks
    assert got["kv_cache_tokens"] == llm.engine.kv.num_blocks * got["block_size"]
    assert 0 < got["kv_cache_gb"] <= 0.01 + 1e-6
