"""The native rotary embedding and KV write (``cpu_elementwise.rotary`` / ``write_kv``,
``csrc/cpu_elementwise.cpp``).

The rotary oracle is Hugging Face's own ``apply_rotary_pos_emb`` (transformers' Llama): in bf16 it
rounds each product and each sum as torch does, and so must the kernel, bit for bit (each product
of two bf16 numbers is exact in fp32). The KV write's oracle is the cache a plain torch index
assignment leaves, padding slots (-1) untouched."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from loraplex.engine.models.layers import RotaryEmbedding
from loraplex.kernels import cpu_elementwise, cpu_native, get_kernel_ops, reference


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _hf(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotation of x [T, heads, D] by our half tables [T, 1, D/2] (HF's hold both halves)."""
    full_cos = torch.cat([cos[:, 0], cos[:, 0]], dim=-1).unsqueeze(0)  # [1, T, D]
    full_sin = torch.cat([sin[:, 0], sin[:, 0]], dim=-1).unsqueeze(0)
    q = x.permute(1, 0, 2).unsqueeze(0)  # [1, heads, T, D]
    out, _ = apply_rotary_pos_emb(q, q, full_cos, full_sin)
    return out[0].permute(1, 0, 2)


def _fused_qk(tokens: int, heads: int, d: int, extra: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """The q|k heads as the model passes them: a view of a wider qkv row (rows strided)."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, heads * d + extra, generator=g) * scale).to(torch.bfloat16)
    return qkv[:, : heads * d].view(tokens, heads, d)


def _tables(d: int, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rope = RotaryEmbedding(d, 4096, {"rope_theta": 10000.0})
    return rope.tables(torch.tensor(positions), torch.bfloat16)


@pytest.mark.parametrize("d", [8, 34, 64, 80, 128])
@pytest.mark.parametrize("tokens,heads", [(1, 1), (7, 12), (64, 4)])
def test_rotary_is_hf_bit_for_bit(tokens, heads, d):
    for seed, scale in ((0, 1.0), (1, 500.0), (2, 1e-3)):
        x = _fused_qk(tokens, heads, d, extra=3 * d, seed=seed, scale=scale)
        cos, sin = _tables(d, [(7 * i + seed * 1000) % 4096 for i in range(tokens)])
        got = cpu_elementwise.rotary(x, cos, sin)
        assert got.dtype == torch.bfloat16 and got.shape == x.shape
        assert torch.equal(_bits(got), _bits(_hf(x, cos, sin))), (tokens, heads, d, scale)
        assert torch.equal(_bits(got), _bits(reference.rotary(x, cos, sin)))


def test_rotary_specials_threads_and_the_portable_build(monkeypatch):
    x = _fused_qk(9, 3, 64, extra=64, seed=3)
    x[0, 0, 0] = float("inf")
    x[1, 1, 40] = float("nan")
    x[2, 2, 5] = 3.0e38  # the product overflows to inf as torch's does
    cos, sin = _tables(64, list(range(100, 109)))
    want = _hf(x, cos, sin)
    nan = torch.isnan(want)

    def check(got: torch.Tensor, what: str) -> None:
        assert torch.equal(torch.isnan(got), nan), what
        assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]), what

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            check(cpu_elementwise.rotary(x, cos, sin), f"{threads} threads")
    finally:
        torch.set_num_threads(before)
    cxx = cpu_native._compiler()
    assert cxx is not None
    monkeypatch.setattr(
        cpu_native, "_lib", cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512f", "-mno-f16c")))
    )
    check(cpu_elementwise.rotary(x, cos, sin), "portable build")


def test_rotary_other_inputs_take_the_torch_twin():
    cos, sin = _tables(16, [1, 2, 3])
    x32 = torch.randn(3, 2, 16)  # float32: the twin, exactly
    assert torch.equal(
        cpu_elementwise.rotary(x32, cos.float(), sin.float()), reference.rotary(x32, cos.float(), sin.float())
    )
    wide = _fused_qk(3, 4, 16, extra=0, seed=4)[:, :, :16].transpose(0, 1).contiguous().transpose(0, 1)
    assert wide.stride(1) != 16  # heads not dense within a row
    assert torch.equal(_bits(cpu_elementwise.rotary(wide, cos, sin)), _bits(reference.rotary(wide, cos, sin)))
    assert cpu_elementwise.rotary(torch.empty(0, 2, 16, dtype=torch.bfloat16), cos[:0], sin[:0]).shape == (0, 2, 16)


def _cache(blocks: int, block: int, heads: int, d: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(blocks, block, heads, d, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_write_kv_is_an_index_assignment(dtype, slot_dtype):
    blocks, block, hkv, d, hq = 6, 8, 3, 32, 9
    k_cache, v_cache = _cache(blocks, block, hkv, d, dtype, 1), _cache(blocks, block, hkv, d, dtype, 2)
    tokens = 11
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g).to(dtype)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)  # strided rows, as the model passes them
    v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
    slots = torch.randperm(blocks * block, generator=g)[:tokens]
    slots[[2, 7]] = -1  # padding
    want_k, want_v = k_cache.clone().view(-1, hkv, d), v_cache.clone().view(-1, hkv, d)
    keep = slots >= 0
    want_k[slots[keep]] = k[keep]
    want_v[slots[keep]] = v[keep]
    cpu_elementwise.write_kv(k_cache, v_cache, k, v, slots.to(slot_dtype))
    assert torch.equal(k_cache.view(-1, hkv, d), want_k) and torch.equal(v_cache.view(-1, hkv, d), want_v)


def test_write_kv_other_layouts_take_the_torch_twin():
    k_cache, v_cache = _cache(2, 4, 2, 8, torch.bfloat16, 5), _cache(2, 4, 2, 8, torch.bfloat16, 6)
    k32, v32 = torch.randn(3, 2, 8), torch.randn(3, 2, 8)  # float32 into a bf16 cache: converted, as torch does
    slots = torch.tensor([5, -1, 0])
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(ref_k, ref_v, k32, v32, slots)
    cpu_elementwise.write_kv(k_cache, v_cache, k32, v32, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_the_cpu_backend_uses_them():
    ops = get_kernel_ops("cpu")
    assert ops.rotary is cpu_elementwise.rotary and ops.write_kv is cpu_elementwise.write_kv
    assert get_kernel_ops("torch").rotary is reference.rotary
