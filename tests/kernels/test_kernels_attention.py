"""Paged attention and KV writes: Triton kernels (interpreter on CPU) and the torch reference
against a dense float64 causal-softmax oracle built from the logical (unpaged) K/V."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_oracles import (
    ATTENTION_CONFIGS,
    PagedKV,
    assert_close_scaled,
    attention_config_id,
    decode_context_lens,
    decode_expected,
    oracle_attention,
    prefill_case,
)

from loraplex.kernels import reference


@pytest.mark.parametrize("cfg", ATTENTION_CONFIGS, ids=attention_config_id)
def test_reference_decode_matches_oracle(cfg):
    bs, hq, hkv, d, dtype = cfg
    kv = PagedKV(decode_context_lens(bs), bs, hkv, d, dtype, seed=1)
    q = torch.randn(len(kv.ctx_lens), hq, d).to(dtype)
    scale = 1 / math.sqrt(d)
    out = reference.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, scale)
    assert_close_scaled(out, decode_expected(kv, q, scale), dtype, "reference decode")


# Triton kernels under TRITON_INTERPRET (a Python interpreter per program instance) were over half of
# the inner loop's time. The inner loop keeps, of each kernel, a small case of every code path
# (decode: forced split-KV and auto, MHA and GQA, fp32 and bf16; prefill: GQA bf16, plus the long
# chunk that crosses tiles below); the larger shapes, d128, fp16 and g8 cases are slow (whole suite).
INNER_LOOP_DECODE = {"bs16-g1-d64-float32-auto", "bs8-g4-d64-bfloat16-split16"}
INNER_LOOP_PREFILL = {"bs8-g4-d64-bfloat16"}


def _cases(ids: set[str], partitions: dict[str, int | None] | None = None) -> list:
    """``ATTENTION_CONFIGS`` (x ``partitions``) as params, marked slow unless their id is in ``ids``."""
    out = []
    for cfg in ATTENTION_CONFIGS:
        for suffix, partition in (partitions or {"": None}).items():
            case = attention_config_id(cfg) + suffix
            values = (cfg, partition) if partitions else (cfg,)
            out.append(pytest.param(*values, id=case, marks=() if case in ids else pytest.mark.slow))
    return out


@pytest.mark.interpret
@pytest.mark.parametrize("cfg,partition", _cases(INNER_LOOP_DECODE, {"-auto": None, "-split16": 16}))
def test_triton_decode_matches_oracle(triton_ops, cfg, partition):
    bs, hq, hkv, d, dtype = cfg
    kv = PagedKV(decode_context_lens(bs), bs, hkv, d, dtype, seed=2)
    q = torch.randn(len(kv.ctx_lens), hq, d).to(dtype)
    scale = 1 / math.sqrt(d)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, scale)
    # partition 16: every context > 16 is split and the partials merged by the reduce kernel.
    out = triton_ops.paged_decode_attention(*args, partition_size=partition)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close_scaled(out, decode_expected(kv, q, scale), dtype, "triton decode")
    assert_close_scaled(out, reference.paged_decode_attention(*args), dtype, "triton decode vs reference")


@pytest.mark.parametrize("cfg", ATTENTION_CONFIGS, ids=attention_config_id)
def test_reference_prefill_matches_oracle(cfg):
    kv, q, qsl, scale, expected = prefill_case(cfg, seed=3)
    out = reference.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    assert_close_scaled(out, expected, cfg[-1], "reference prefill")


@pytest.mark.interpret
@pytest.mark.parametrize("cfg", _cases(INNER_LOOP_PREFILL))
def test_triton_prefill_matches_oracle(triton_ops, cfg):
    kv, q, qsl, scale, expected = prefill_case(cfg, seed=4)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    out = triton_ops.paged_prefill_attention(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close_scaled(out, expected, cfg[-1], "triton prefill")
    assert_close_scaled(out, reference.paged_prefill_attention(*args), cfg[-1], "triton prefill vs reference")
    explicit = triton_ops.paged_prefill_attention(*args, max_query_len=int((qsl[1:] - qsl[:-1]).max()))
    assert torch.equal(explicit, out)


@pytest.mark.interpret
def test_triton_decode_auto_split_long_context(triton_ops):
    """One long sequence: the automatic policy splits it (no override) and the merge is exact."""
    from loraplex.kernels import triton_decode_attention

    bs, hq, hkv, d, dtype = 16, 4, 1, 64, torch.float32
    kv = PagedKV([600], bs, hkv, d, dtype, seed=11)
    q = torch.randn(1, hq, d)
    out = triton_ops.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    assert_close_scaled(out, decode_expected(kv, q, 0.125), dtype, "auto split")
    max_ctx = kv.block_tables.shape[1] * bs
    assert triton_decode_attention._decode_partition(1, hkv, max_ctx, d, q.device, None)[2] > 1


@pytest.mark.interpret
def test_triton_prefill_long_chunk_crosses_tiles(triton_ops):
    """A chunk longer than one query tile, over a prefix longer than one key tile."""
    cfg = (16, 4, 2, 64, torch.float32)
    bs, hq, hkv, d, dtype = cfg
    kv = PagedKV([150], bs, hkv, d, dtype, seed=9)
    q = torch.randn(70, hq, d)
    qsl = torch.tensor([0, 70], dtype=torch.int32)
    out = triton_ops.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, 0.125)
    assert_close_scaled(out, oracle_attention(q, kv.keys[0], kv.values[0], 150, 0.125), dtype, "long chunk")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_write_kv(impl, dtype, request):
    ops = request.getfixturevalue("triton_ops") if impl == "triton" else reference
    num_blocks, bs, hkv, d = 4, 8, 2, 64
    k_cache = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([3, -1, 17, 8, 31], dtype=torch.int32)
    k = torch.randn(5, hkv, d, dtype=torch.float32)  # cast to the cache dtype on write
    v = torch.randn(5, hkv, d, dtype=torch.float32)
    ops.write_kv(k_cache, v_cache, k, v, slots)
    flat_k = k_cache.view(-1, hkv, d)
    flat_v = v_cache.view(-1, hkv, d)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k[t].to(dtype)) and torch.equal(flat_v[s], v[t].to(dtype))
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [i for i in range(num_blocks * bs) if i not in written]
    assert torch.isnan(flat_k[untouched].float()).all() and torch.isnan(flat_v[untouched].float()).all()


def test_triton_ops_signatures_match_reference():
    import inspect

    pytest.importorskip("triton")
    from loraplex.kernels import get_kernel_ops

    ops = get_kernel_ops("triton", "cpu")
    assert ops.name == "triton"
    for name in ("write_kv", "paged_decode_attention", "paged_prefill_attention", "sgmv_shrink", "sgmv_expand"):
        ref = [p.name for p in inspect.signature(getattr(reference, name)).parameters.values()]
        tri = inspect.signature(getattr(ops, name)).parameters
        assert list(tri)[: len(ref)] == ref, name
        extra = [p for p in list(tri.values())[len(ref) :]]
        assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), name
