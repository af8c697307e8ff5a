"""The native CPU paged DECODE attention (one query row per sequence): the AVX-512 tile (d a multiple
of 16 up to 128, online softmax, 16 tokens' scores reduced together) and the portable tile (a
``-mno-avx512f`` build, and shapes the fast tile does not take) against the float64 oracle, and
against each other within fp32 summation order."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_oracles import PagedKV, assert_close_scaled, decode_expected

from loraplex.kernels import cpu_native

CTX = [1, 15, 16, 17, 200]


@pytest.fixture(scope="module")
def portable():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"
    cxx = cpu_native._compiler()
    assert cxx is not None
    return cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512f", "-mno-f16c")))


def _decode(lib, monkeypatch, *args):
    with monkeypatch.context() as m:
        m.setattr(cpu_native, "_lib", lib)
        return cpu_native.paged_decode_attention(*args)


def _case(ctx, bs, hq, hkv, d, dtype, seed):
    kv = PagedKV(ctx, bs, hkv, d, dtype, seed=seed)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return kv, q, (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 1 / math.sqrt(d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_decode_matches_oracle_both_builds(dtype, d, group, portable, monkeypatch):
    """Contexts 1/15/16/17/200 mixed in one batch (a partial block, exactly one, one past, many)."""
    hkv = 2
    kv, q, args = _case(CTX, 16, group * hkv, hkv, d, dtype, seed=31 + d + group)
    expected = decode_expected(kv, q, args[-1])
    fast = cpu_native.paged_decode_attention(*args)
    slow = _decode(portable, monkeypatch, *args)
    assert_close_scaled(fast, expected, dtype, "native decode")
    assert_close_scaled(slow, expected, dtype, "portable decode")
    if dtype == torch.float32:  # the two tiles differ only by fp32 rounding
        assert_close_scaled(fast, slow, dtype, "native vs portable")
    else:  # the same bf16 value or one bf16 step apart (near-cancelling sums: fp32 noise of the row)
        diff = (fast.float() - slow.float()).abs()
        step = torch.maximum(fast.float().abs(), slow.float().abs()) * 2**-7 + 1e-5 * slow.float().abs().max()
        assert bool((diff <= step).all()), float((diff - step).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [8, 16, 32, 5])
def test_block_sizes(dtype, bs):
    """Blocks smaller than, equal to and larger than the tile's 16-token chunks, and odd sizes."""
    kv, q, args = _case([1, bs - 1, bs + 1, 3 * bs + 2, 37], bs, 6, 2, 64, dtype, seed=40 + bs)
    assert_close_scaled(cpu_native.paged_decode_attention(*args), decode_expected(kv, q, args[-1]), dtype, "bs")


@pytest.mark.parametrize("d", [48, 72])
def test_other_head_dims_take_the_portable_tile(d):
    """d = 48 (a multiple of 16 the fast tile does not instantiate) and 72 (not a multiple of 16)
    fall back to the portable tile and stay correct."""
    kv, q, args = _case([5, 40], 16, 4, 2, d, torch.bfloat16, seed=50 + d)
    assert_close_scaled(
        cpu_native.paged_decode_attention(*args), decode_expected(kv, q, args[-1]), torch.bfloat16, "odd d"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_and_minus_inf_scores(dtype, portable, monkeypatch):
    """Scores of several thousand (the online max grows from block to block) and keys that make a
    score -inf (those tokens get zero weight), including a whole first block of -inf."""
    kv, q, args = _case([40, 33, 70], 16, 4, 2, 64, dtype, seed=60)
    q.mul_(4)
    for s in range(3):  # growing keys: the running max is exceeded in every block
        ramp = torch.linspace(1, 30, kv.ctx_lens[s])[:, None, None]
        kv.keys[s] = (kv.keys[s].float() * ramp).to(dtype)
    kv.keys[0][:16] = float("-inf")  # first block of sequence 0: exp(-inf) = 0 everywhere
    kv.keys[1][5] = float("-inf")
    for s, c in enumerate(kv.ctx_lens):
        for p in range(c):
            blk = int(kv.block_tables[s, p // 16])
            kv.k_cache[blk, p % 16] = kv.keys[s][p]
    # q > 0 on head-dim 0 only for the -inf rows' sign to be known: score = q . k with k = -inf
    # everywhere -> -inf if sum(q) > 0 is not guaranteed, so make the -inf keys hit a positive q.
    q.abs_()
    expected = decode_expected(kv, q, args[-1])
    assert torch.isfinite(expected).all()
    fast = cpu_native.paged_decode_attention(*args)
    assert_close_scaled(fast, expected, dtype, "large scores")
    assert_close_scaled(_decode(portable, monkeypatch, *args), expected, dtype, "large scores portable")
    assert float(expected.abs().max()) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_independence_and_threads(dtype):
    """A row's output is bit-identical alone and inside a batch, and with 1 or several threads."""
    ctx = [200, 1, 17, 64, 15, 129]
    kv, q, args = _case(ctx, 16, 12, 4, 64, dtype, seed=70)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_native.paged_decode_attention(*args)
    finally:
        torch.set_num_threads(threads)
    batch = cpu_native.paged_decode_attention(*args)
    assert torch.equal(one, batch)
    for s in range(len(ctx)):
        alone = cpu_native.paged_decode_attention(
            q[s : s + 1], kv.k_cache, kv.v_cache, kv.block_tables[s : s + 1], kv.context_lens[s : s + 1], args[-1]
        )
        assert torch.equal(alone[0], batch[s]), s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_keep_the_portable_tile(dtype):
    """Rows of a multi-row prefill chunk never take the decode tile, whichever kernel tile they fall
    in: 5 identical rows of one sequence (tiles of 4 + 1) give 5 bit-identical outputs, while the
    same query as a sequence's only row (decode) agrees within rounding."""
    assert cpu_native.available()
    kv, q, args = _case([77], 16, 6, 2, 64, dtype, seed=80)
    rows = q.expand(5, -1, -1).contiguous()
    seq = torch.zeros(5, dtype=torch.int32)
    lens = torch.full((5,), 77, dtype=torch.int32)
    out = cpu_native._call(rows, kv.k_cache, kv.v_cache, kv.block_tables, seq, lens, args[-1])
    for r in range(1, 5):
        assert torch.equal(out[r], out[0]), r
    assert_close_scaled(out[:1], cpu_native.paged_decode_attention(*args), dtype, "prefill row vs decode")
