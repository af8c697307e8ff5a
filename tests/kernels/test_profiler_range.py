"""The native kernels' named profiler ranges (``kernels/profiler_range.py``): recorded under
``torch.profiler`` (``benchmarks/peers/step_profile.py`` files the ctypes calls by these names), and
outside a profiler no ``record_function`` is entered at all (one costs ~6-7 µs; a bf16 decode step
calls 150-400 kernels: 39.0-39.7 vs 41.3-42.5 ms a step at batch 16 on the demo model)."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import make_lora_weights, token_slots_from_segments

from loraplex.kernels import cpu_elementwise, cpu_native, cpu_sgmv, make_lora_segments

NAMES = {
    "loraplex::cpu_rms_norm",
    "loraplex::cpu_silu_mul",
    "loraplex::cpu_paged_attention",
    "loraplex::cpu_sgmv_shrink",
    "loraplex::cpu_sgmv_expand",
}


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _run_kernels() -> None:
    """One call of each wrapped native kernel, bf16 (the dtype the element-wise kernels take)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g).bfloat16()
    cpu_elementwise.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6)
    cpu_elementwise.silu_mul(torch.randn(4, 128, generator=g).bfloat16())
    block, hq, hkv, d = 8, 4, 2, 32
    k_cache = torch.randn(6, block, hkv, d, generator=g).bfloat16()
    v_cache = torch.randn(6, block, hkv, d, generator=g).bfloat16()
    q = torch.randn(2, hq, d, generator=g).bfloat16()
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    cpu_native.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor([20, 9], dtype=torch.int32), 0.2)
    slots = token_slots_from_segments([(0, 2), (1, 2)])
    a, b, ranks, scales, offsets = make_lora_weights(2, [4, 8], 64, [64], torch.bfloat16, 1)
    seg = make_lora_segments(slots)
    shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    cpu_sgmv.sgmv_expand(torch.zeros(4, 64, dtype=torch.bfloat16), shrunk, b, seg, ranks, scales, offsets)


def test_the_ranges_are_recorded_under_a_profiler():
    with torch.profiler.profile() as prof:
        _run_kernels()
    assert NAMES <= {e.name for e in prof.events()}


def test_no_record_function_is_entered_without_a_profiler(monkeypatch):
    entered: list[str] = []
    real = torch.profiler.record_function

    def counting(name, *a, **k):
        entered.append(name)
        return real(name, *a, **k)

    monkeypatch.setattr(torch.profiler, "record_function", counting)
    _run_kernels()
    assert entered == []
    # the control: the same calls under a profiler go through the patched function
    with torch.profiler.profile():
        _run_kernels()
    assert NAMES <= set(entered)
