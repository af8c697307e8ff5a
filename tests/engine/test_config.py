"""EngineConfig and its views: one rule per field, checked without a model directory where possible."""

from __future__ import annotations

import pytest

from loraplex import kernels
from loraplex.engine.config import KERNEL_BACKENDS, EngineConfig, SchedulerConfig


def test_engine_kernel_backends_are_the_kernels_backends():
    assert set(KERNEL_BACKENDS) == set(kernels.BACKENDS)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("max_num_seqs", 0, "max_num_seqs must be a positive integer"),
        ("scheduling_policy", "lifo", "scheduling_policy must be one of"),
        ("max_kv_share_per_tenant", 1.5, "max_kv_share_per_tenant"),
        ("batching", "dynamic", "batching must be one of"),
    ],
)
def test_scheduler_config_refuses_bad_values(field, value, words):
    with pytest.raises(ValueError, match=words):
        SchedulerConfig(**{field: value})


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"dtype": "float64"}, "dtype must be"),
        ({"kernel_backend": "cuda"}, "kernel_backend must be one of"),
        ({"max_cpu_loras": 2, "max_loras": 4}, "max_cpu_loras"),
        ({"watermark": 0.7}, "watermark"),
        ({"bogus": 1}, "unknown engine setting"),
    ],
)
def test_check_without_a_model_directory(fields, words):
    with pytest.raises((ValueError, TypeError), match=words):
        EngineConfig.check(**fields)
    EngineConfig.check()  # the defaults are valid


def test_views_carry_the_flat_fields(tiny_llama):
    cfg = EngineConfig(model=tiny_llama, max_num_seqs=7, block_size=8, max_loras=3, max_cpu_loras=5)
    assert cfg.scheduler_config.max_num_seqs == 7 and cfg.scheduler_config.max_loras == 3
    assert cfg.cache_config.block_size == 8
    assert cfg.lora_config.max_cpu_loras == 5
