"""W8A8 matmul (``kernels/w8a8.py``): the per-row activation quantizer, the int32 accumulation and the
rescaled output of every path (torch oracle backend, native CPU path as built here, the portable
build of the quantizer) against this file's own oracle: codes computed one row at a time, the
integer product in int64, the rescale in float64. And row independence: a row's output is
bit-identical alone and inside a batch with an outlier row (the multi-tenant requirement)."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import TORCH_OPS, batch_invariant_ops, cpu_native, get_kernel_ops, quantize_per_channel_int8, w8a8

# (rows, K, N): decode rows, odd counts, K not a multiple of 16/64, odd N, prefill-sized rows.
SHAPES = [(1, 64, 96), (2, 100, 33), (7, 130, 65), (16, 576, 97), (37, 77, 1), (129, 200, 31), (513, 65, 19)]


def _native() -> bool:
    return cpu_native.load() is not None


def _rows_oracle(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8, one row at a time: scale = max|x| / 127 in float32 (1 for a zero
    row), code = round-half-even(x / scale) in float32, clamped to +-127."""
    codes, scales = [], []
    for row in x.float():
        amax = float(row.abs().max()) if row.numel() else 0.0
        s = torch.tensor(amax, dtype=torch.float32) / 127 if amax > 0 else torch.tensor(1.0)
        codes.append(torch.round(row / s).clamp(-127, 127).to(torch.int8))
        scales.append(s)
    k = x.shape[-1]
    return (torch.stack(codes) if codes else torch.zeros(0, k, dtype=torch.int8)), torch.stack(scales).reshape(-1)


def _oracle(x, qw, ws, b):
    """float64 y from the oracle's codes, the int64 product and the float32 scales."""
    xq, xs = _rows_oracle(x.reshape(-1, x.shape[-1]))
    acc = xq.long() @ qw.long().T
    y = acc.double() * xs.double()[:, None] * ws.double()
    if b is not None:
        y = y + b.double()
    return acc, y


def _magnitude(x, qw, ws, b):
    """|acc| * scales (+ |bias|): what float32 rounding errors scale with (a bias may cancel y)."""
    acc, _ = _oracle(x, qw, ws, None)
    xs = _rows_oracle(x.reshape(-1, x.shape[-1]))[1]
    mag = acc.abs().double() * xs.double()[:, None] * ws.double()
    return mag if b is None else mag + b.double().abs()


def _case(m, k, n, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.linspace(0.05, 2.0, n)[:, None]
    x = (torch.randn(m, k, generator=g) * torch.linspace(0.1, 30.0, m)[:, None]).to(dtype)
    if m > 2:
        x[m // 2] = 0.0  # an all-zero row: scale 1, output = bias
        x[1, k // 3] = 5000.0  # an outlier inside a row
    qw, ws = quantize_per_channel_int8(w)
    b = (torch.randn(n, generator=g)).to(dtype) if bias else None
    return x, qw, ws, b


def _check_close(y: torch.Tensor, exp: torch.Tensor, dtype: torch.dtype, mag: torch.Tensor) -> None:
    # float32: a few float32 roundings of the terms (``mag``); bf16: plus one rounding of the result.
    rounding = 0.0 if dtype == torch.float32 else 2.0**-8
    err = (y.double() - exp).abs()
    assert (err <= rounding * exp.abs() + 1e-6 * mag + 1e-30).all(), (err.max().item(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_quantizer_matches_row_oracle(dtype):
    x, *_ = _case(37, 130, 5, dtype)
    q, s = w8a8.quantize_rows_int8(x)
    eq, es = _rows_oracle(x)
    assert torch.equal(q, eq) and torch.equal(s, es)
    # Round to nearest: every value within half a step of its code (zero row: exact zeros).
    assert ((q.float() * s[:, None] - x.float()).abs() <= s[:, None] * (0.5 + 1e-4)).all()
    assert int(q.abs().max()) == 127


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_native_quantizer_and_int32_accumulation_are_exact(m, k, n, dtype):
    if not _native():
        pytest.skip("no native CPU kernels")
    x, qw, ws, b = _case(m, k, n, dtype, seed=m)
    q, s = w8a8.quantize_rows_cpu(x)
    eq, es = _rows_oracle(x)
    assert torch.equal(q, eq) and torch.equal(s, es)
    acc = w8a8.int_mm_cpu(q, qw)
    assert acc.dtype == torch.int32 and torch.equal(acc.long(), eq.long() @ qw.long().T)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_w8a8_linear_matches_float64_oracle(backend, m, k, n, dtype):
    if backend == "cpu" and not _native():
        pytest.skip("no native CPU kernels")
    ops = get_kernel_ops(backend)
    for bias in (True, False):
        x, qw, ws, b = _case(m, k, n, dtype, bias=bias, seed=m + k)
        y = ops.w8a8_linear(x, qw, ws, b)
        assert y.dtype == dtype and y.shape == (m, n)
        _check_close(y, _oracle(x, qw, ws, b)[1], dtype, _magnitude(x, qw, ws, b))
        if m > 2:  # the zero row's output is the bias exactly
            assert torch.equal(y[m // 2], b if bias else torch.zeros(n, dtype=dtype))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_w8a8_strided_3d_and_empty_inputs(backend):
    ops = get_kernel_ops(backend)
    x, qw, ws, b = _case(12, 96, 40, torch.bfloat16)
    x3 = x.reshape(3, 4, 96)
    y3 = ops.w8a8_linear(x3, qw, ws, b)
    assert y3.shape == (3, 4, 40) and torch.equal(y3.reshape(12, 40), ops.w8a8_linear(x, qw, ws, b))
    wide = torch.zeros(12, 200, dtype=torch.bfloat16)
    wide[:, 50:146] = x
    strided = wide[:, 50:146]  # a row stride of 200: a view, not a copy
    assert torch.equal(ops.w8a8_linear(strided, qw, ws, b), ops.w8a8_linear(x, qw, ws, b))
    cols = torch.zeros(12, 192, dtype=torch.bfloat16)
    cols[:, ::2] = x
    assert torch.equal(ops.w8a8_linear(cols[:, ::2], qw, ws, b), ops.w8a8_linear(x, qw, ws, b))  # column stride 2
    empty = ops.w8a8_linear(x[:0], qw, ws, b)
    assert empty.shape == (0, 40) and empty.dtype == torch.bfloat16
    assert ops.w8a8_linear(torch.zeros(2, 0, 96), qw, ws).shape == (2, 0, 40)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_w8a8_extreme_values(backend):
    ops = get_kernel_ops(backend)
    k, n = 70, 9
    w = torch.randn(n, k)
    w[0] = 0.0
    w[1] = 3e4
    qw, ws = quantize_per_channel_int8(w)
    x = torch.randn(6, k)
    x[0] = 1e30  # huge but finite
    x[1] = -1e-30  # tiny, still normal after / 127
    x[2, :] = 0.0
    x[2, 5] = -7.0  # one nonzero: its code is -127 exactly
    x[3] = 127.0 * torch.arange(k) / k  # values on the grid, and half-way points below
    x[4, ::2] = 0.5
    x[4, 1::2] = -0.5
    x[5] = -0.0
    y = ops.w8a8_linear(x, qw, ws)
    acc, exp = _oracle(x, qw, ws, None)
    assert torch.isfinite(y).all()
    assert (acc.abs() <= 127 * 127 * k).all()
    _check_close(y, exp, torch.float32, _magnitude(x, qw, ws, None))
    # All-max codes: the int32 accumulators at their extreme for this K, exactly.
    big_k = 4099
    xq = torch.full((3, big_k), -127, dtype=torch.int8)
    wq = torch.full((5, big_k), 127, dtype=torch.int8)
    if backend == "cpu" and _native():
        assert torch.equal(w8a8.int_mm_cpu(xq, wq), torch.full((3, 5), -127 * 127 * big_k, dtype=torch.int32))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_output_is_bit_identical_alone_and_beside_an_outlier_row(backend, dtype):
    """The multi-tenant requirement: one activation scale per row, so a neighbour's outliers never
    change a row's codes, and the integer GEMM and per-element epilogue never mix rows. A
    per-tensor scale (oneDNN qlinear's) fails this: the control at the end shows it would."""
    ops = get_kernel_ops(backend)
    x, qw, ws, b = _case(5, 576, 130, dtype, seed=4)
    alone = [ops.w8a8_linear(x[i : i + 1], qw, ws, b) for i in range(5)]
    outlier = torch.randn(1, 576).to(dtype) * 1e4
    for batch in (
        torch.cat([outlier, x]),
        torch.cat([x, outlier, x]),
        torch.cat([x[:2], outlier, torch.randn(300, 576).to(dtype), x[2:]]),  # prefill-sized batch
    ):
        y = ops.w8a8_linear(batch, qw, ws, b)
        rows = [int(torch.nonzero((batch == x[i]).all(dim=1))[0]) for i in range(5)]
        for i, r in enumerate(rows):
            assert torch.equal(y[r : r + 1], alone[i]), (i, r)
    # Control: with one scale for the whole tensor, the outlier would change a row's codes.
    both = torch.cat([outlier, x[:1]]).float()
    per_tensor = torch.round(both / (both.abs().max() / 127)).clamp(-127, 127)[1]
    assert not torch.equal(per_tensor.to(torch.int8), _rows_oracle(x[:1])[0][0])


def test_native_path_does_not_depend_on_threads():
    if not _native():
        pytest.skip("no native CPU kernels")
    x, qw, ws, b = _case(67, 300, 45, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = w8a8.w8a8_linear_cpu(x, qw, ws, b)
        torch.set_num_threads(2)
        two = w8a8.w8a8_linear_cpu(x, qw, ws, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_batch_invariant_ops_keep_w8a8_row_independent():
    if not _native():
        pytest.skip("no native CPU kernels")
    ops = batch_invariant_ops(get_kernel_ops("cpu"))
    x, qw, ws, b = _case(40, 128, 33, torch.bfloat16)
    full = ops.w8a8_linear(x, qw, ws, b)
    assert all(torch.equal(full[i : i + 1], ops.w8a8_linear(x[i : i + 1], qw, ws, b)) for i in range(40))
    assert TORCH_OPS.w8a8_linear is w8a8.w8a8_linear_reference


@pytest.mark.parametrize("variant", ["portable", "avx512"])
def test_every_quantizer_build_matches_oracle(variant, monkeypatch):
    """The AVX-512 quantizer and the portable loop (what a CPU without AVX-512 runs), each from its
    own build, give the oracle's codes and scales exactly. The AVX-512 build is only compiled (not
    run) on a CPU without AVX-512."""
    cxx = cpu_native._compiler()
    if cxx is None or not _native():
        pytest.skip("no C++ compiler")
    flags = set(cpu_native._cpu_signature().split())
    if variant == "avx512":
        path = cpu_native.build(cxx, ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"))
        if not {"avx512f", "avx512bw"} <= flags:
            return
    else:
        path = cpu_native.build(cxx, ("-mno-avx512f", "-mno-avx2", "-mno-fma", "-mno-f16c"))
    lib = cpu_native.open_library(path)
    assert lib.lp_w8a8_isa() == (1 if variant == "avx512" else 0)
    monkeypatch.setattr(cpu_native, "_lib", lib)
    for dtype in (torch.float32, torch.bfloat16):
        for m, k, n in SHAPES[:6]:
            x, qw, ws, b = _case(m, k, n, dtype, seed=k)
            q, s = w8a8.quantize_rows_cpu(x)
            eq, es = _rows_oracle(x)
            assert torch.equal(q, eq) and torch.equal(s, es), (variant, m, k, dtype)
            _check_close(w8a8.w8a8_linear_cpu(x, qw, ws, b), _oracle(x, qw, ws, b)[1], dtype, _magnitude(x, qw, ws, b))
