"""The batch-invariant ops compute a row the same whatever else the call holds: a row's output is
bit-identical alone, at any position among M other rows, for every M. Oracle: the same op on the
row alone (and the plain op as the control that a row's bits do depend on M there)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.kernels import ROW_TILE, batch_invariant_ops, cpu_native, get_kernel_ops

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="needs the native CPU kernels")

ROWS = (1, 2, 3, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1, 40, 65, 130)


def _rows_equal_alone(linear, x: torch.Tensor, w: torch.Tensor, packed) -> bool:
    alone = linear(x[:1], w, None, packed)[0]
    for m in ROWS:
        for pos in {0, m // 2, m - 1}:
            batch = x[1 : m + 1].clone()
            batch[pos] = x[0]
            if not torch.equal(linear(batch, w, None, packed)[pos], alone):
                return False
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_linear_gives_a_row_the_same_bits_in_any_batch(dtype):
    torch.manual_seed(0)
    ops = batch_invariant_ops(get_kernel_ops("cpu"))
    w = (torch.randn(384, 256) * 0.05).to(dtype)
    packed = ops.pack_linear_weight(w)
    plain_w = None if packed is not None and packed.is_mkldnn else w
    x = (torch.randn(140, 256)).to(dtype)
    assert _rows_equal_alone(ops.linear, x, plain_w, packed)
    # The same values as the plain op (only the grouping of rows into calls changed).
    torch.testing.assert_close(ops.linear(x, plain_w, None, packed), F.linear(x, w), rtol=2e-2, atol=2e-2)


def test_plain_float32_gemm_is_not_batch_invariant():
    """The control: MKL's float32 GEMM sums a row differently as M grows (why the mode exists)."""
    torch.manual_seed(0)
    w, x = torch.randn(384, 256) * 0.05, torch.randn(140, 256)
    assert not _rows_equal_alone(lambda a, w, b, p: F.linear(a, w), x, w, None)


def test_prefill_attention_rows_do_not_depend_on_chunking():
    """A prompt's attention rows computed as one 80-token chunk (the plain op takes SDPA for a
    whole prompt of >= 64 tokens) equal those of the same prompt in chunks of 30 + 50."""
    torch.manual_seed(1)
    bs, hkv, hq, d, n = 16, 2, 4, 32, 80
    k_cache = torch.randn(8, bs, hkv, d)
    v_cache = torch.randn(8, bs, hkv, d)
    tables = torch.arange(8, dtype=torch.int32).unsqueeze(0)
    q = torch.randn(n, hq, d)
    attend = batch_invariant_ops(get_kernel_ops("cpu")).paged_prefill_attention

    def chunk(lo: int, hi: int, op=attend) -> torch.Tensor:
        qsl = torch.tensor([0, hi - lo], dtype=torch.int32)
        return op(q[lo:hi], k_cache, v_cache, tables, qsl, torch.tensor([hi], dtype=torch.int32), d**-0.5)

    whole = chunk(0, n)
    assert torch.equal(torch.cat([chunk(0, 30), chunk(30, n)]), whole)
    plain = get_kernel_ops("cpu").paged_prefill_attention
    assert not torch.equal(torch.cat([chunk(0, 30, plain), chunk(30, n, plain)]), chunk(0, n, plain))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decoded_position_has_the_bits_of_its_prefill_row(dtype):
    """Every position of a 60-token sequence attended as a decode row (its query alone, context up
    to itself) and as a 1-token chunk equals its row in one 60-token prefill chunk: preemption
    recomputes decoded positions in a prefill, and a seed must give the same tokens then. The
    plain ops are the control: their decode rows take the AVX-512 decode tile (an online softmax
    rounding differently), so some position differs there (on a CPU with AVX-512)."""
    torch.manual_seed(2)
    bs, hkv, hq, d, n = 16, 3, 9, 64, 60
    k_cache = torch.randn(4, bs, hkv, d).to(dtype)
    v_cache = torch.randn(4, bs, hkv, d).to(dtype)
    tables = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    q = (torch.randn(n, hq, d) * 2).to(dtype)

    def rows(ops) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scale = d**-0.5
        qsl = torch.tensor([0, n], dtype=torch.int32)
        prefill = ops.paged_prefill_attention(
            q, k_cache, v_cache, tables, qsl, torch.tensor([n], dtype=torch.int32), scale
        )
        one = torch.tensor([0, 1], dtype=torch.int32)
        decoded, single = [], []
        for p in range(n):
            ctx = torch.tensor([p + 1], dtype=torch.int32)
            decoded.append(ops.paged_decode_attention(q[p : p + 1], k_cache, v_cache, tables, ctx, scale)[0])
            single.append(ops.paged_prefill_attention(q[p : p + 1], k_cache, v_cache, tables, one, ctx, scale)[0])
        return prefill, torch.stack(decoded), torch.stack(single)

    prefill, decoded, single = rows(batch_invariant_ops(get_kernel_ops("cpu")))
    assert torch.equal(decoded, prefill)
    assert torch.equal(single, prefill)
    if cpu_native.decode_tile_available():
        plain_prefill, plain_decoded, _ = rows(get_kernel_ops("cpu"))
        assert not torch.equal(plain_decoded, plain_prefill)
