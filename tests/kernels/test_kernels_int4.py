"""INT4 weight-only matmul: the group-wise quantizer, the packed layout (read back by this file's own
unpacking), and every path (torch twin, native kernel as built here, the AVX2, AVX-512 and portable
builds, the prefill-sized dequantize + GEMM) against a float64 oracle computed from the codes."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import (
    TORCH_OPS,
    batch_invariant_ops,
    check_group_size,
    cpu_int4,
    cpu_native,
    get_kernel_ops,
    int4_linear_reference,
    pack_int4,
    quantize_int4,
)

# (M rows, K in, N out, group): decode rows (1, 3, odd counts that leave a partial row tile),
# K not a multiple of the group (a partial last group) and not of 32, odd N, and rows past
# cpu_int4.DIRECT_MAX_ROWS (the dequantize + dense GEMM path).
SHAPES = [
    (1, 64, 96, 32),
    (3, 100, 33, 32),
    (7, 130, 65, 64),
    (16, 256, 40, 128),
    (5, 200, 17, 128),
    (2, 96, 31, 256),
    (37, 100, 130, 64),
]


def _case(m, k, n, group, dtype=torch.float32, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Rows of very different ranges, and one all-zero row (its scale must not divide by zero).
    w = torch.randn(n, k, generator=g) * torch.linspace(0.05, 2.0, n)[:, None]
    w[n // 2] = 0.0
    x = torch.randn(m, k, generator=g).to(dtype)
    b = (torch.randn(n, generator=g) * 0.1).to(dtype) if bias else None
    codes, scales, zeros = quantize_int4(w, group)
    return w, x, b, (codes, scales, zeros), pack_int4(codes, scales, zeros, group)


def _dequant64(codes, scales, zeros, group):
    """W = (q - zero) * scale in float64, from the unpacked codes (not from the packed layout)."""
    k = codes.shape[1]
    s = scales.double().repeat_interleave(group, dim=1)[:, :k]
    z = zeros.double().repeat_interleave(group, dim=1)[:, :k]
    return (codes.double() - z) * s


def _oracle(x, q, b, group):
    y = x.double() @ _dequant64(*q, group).T
    return y + b.double() if b is not None else y


def _unpack_by_hand(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The documented layout, read one byte at a time: chunk c's byte j holds column 32c + j in its
    low nibble and 32c + 16 + j in its high nibble."""
    n, half = packed.shape
    out = torch.zeros(n, half * 2, dtype=torch.uint8)
    for row in range(n):
        for byte in range(half):
            c, j = divmod(byte, 16)
            v = int(packed[row, byte])
            out[row, 32 * c + j] = v & 0xF
            out[row, 32 * c + 16 + j] = v >> 4
    return out[:, :k]


def test_quantizer_is_asymmetric_groupwise_and_round_to_nearest():
    w = torch.randn(6, 100) * 0.3 + torch.linspace(-1, 1, 6)[:, None]  # offset rows: asymmetric ranges
    w[2, :64] = torch.rand(64) + 0.5  # a group entirely above zero
    codes, scales, zeros = quantize_int4(w, 32)
    assert codes.shape == (6, 100) and scales.shape == (6, 4) and zeros.shape == (6, 4)
    assert int(codes.max()) <= 15 and int(zeros.max()) <= 15
    err = (_dequant64(codes, scales, zeros, 32) - w.double()).abs()
    half_step = scales.double().repeat_interleave(32, dim=1)[:, :100] / 2
    assert bool((err <= half_step + 1e-6).all())
    # Every group's range reaches both ends of the 16 codes (or includes 0 where it does not cross it).
    for r in range(6):
        for g in range(4):
            grp = codes[r, 32 * g : 32 * g + 32]
            assert int(grp.max()) == 15 or int(grp.min()) == 0
    # Zeros of the weight stay exact zeros (the range always includes 0 and zero is a code).
    w0 = w.clone()
    w0[:, ::7] = 0.0
    c0, s0, z0 = quantize_int4(w0, 32)
    assert bool((_dequant64(c0, s0, z0, 32)[:, ::7] == 0).all())


def test_packed_layout_is_the_documented_one():
    _, _, _, (codes, scales, zeros), packed = _case(1, 100, 5, 64)
    assert packed.codes.dtype == torch.uint8 and packed.codes.shape == (5, 64)  # K=100 -> 128 columns
    assert packed.group_size == 64
    assert torch.equal(_unpack_by_hand(packed.codes, 100), codes)
    assert bool((_unpack_by_hand(packed.codes, 128)[:, 100:] == 0).all())  # padding codes are 0
    assert torch.allclose(packed.offsets.double(), -zeros.double() * scales.double())


@pytest.mark.parametrize("bad", [0, 16, 48, 100, -1, 128.0, True, "128"])
def test_bad_group_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="multiple of 32"):
        check_group_size(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n,group", SHAPES)
def test_reference_torch_and_native_paths_match_oracle(m, k, n, group, dtype):
    _, x, b, q, packed = _case(m, k, n, group, dtype, bias=(m % 2 == 1))
    exp = _oracle(x, q, b, group)
    scale = exp.abs().max().item()
    # fp32: the paths differ from float64 only by summation order; bf16: rounding of the output.
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    for name, y in (
        ("reference", int4_linear_reference(x, packed, b)),
        ("torch", TORCH_OPS.int4_linear(x, packed, b)),
        ("native", get_kernel_ops("cpu").int4_linear(x, packed, b)),
    ):
        assert y.dtype == dtype and y.shape == (m, n), name
        assert (y.double() - exp).abs().max().item() <= tol * scale, (name, m, k, n, group)


def test_native_kernel_every_decode_row_count():
    """Every row count the direct kernel takes (whole 4-row tiles and every remainder tile), each
    row against the float64 oracle."""
    _, x, b, q, packed = _case(cpu_int4.DIRECT_MAX_ROWS, 160, 24, 32, bias=True, seed=4)
    exp = _oracle(x, q, b, 32)
    ops = get_kernel_ops("cpu")
    for m in range(1, cpu_int4.DIRECT_MAX_ROWS + 1):
        y = ops.int4_linear(x[:m], packed, b)
        assert (y.double() - exp[:m]).abs().max().item() <= 2e-5 * exp.abs().max().item(), m


def test_leading_dims_and_empty_batches():
    _, x, b, q, packed = _case(6, 64, 24, 32, bias=True)
    ops = get_kernel_ops("cpu")
    y3 = ops.int4_linear(x.view(2, 3, 64), packed, b)
    assert y3.shape == (2, 3, 24)
    assert torch.allclose(y3.reshape(6, 24).double(), _oracle(x, q, b, 32), rtol=0, atol=1e-4)
    assert ops.int4_linear(x[:0], packed, b).shape == (0, 24)


def _cpu_flags() -> set[str]:
    return set(cpu_native._cpu_signature().split())


# Builds of the native library this machine can run, by the int4 path each one takes. The native
# build takes the best path of this CPU; the others are forced with extra compiler flags.
VARIANTS = {
    "avx2": ("-mno-avx512f",),
    "scalar": ("-mno-avx512f", "-mno-avx2", "-mno-fma", "-mno-f16c"),
}


@pytest.mark.parametrize("variant", ["avx2", "scalar", "avx512"])
def test_every_isa_build_matches_oracle(variant, monkeypatch):
    """The AVX-512, AVX2+FMA and portable paths, each from its own build, against the oracle.
    The AVX-512 build is only compiled (not run) on a CPU without AVX-512F."""
    cxx = cpu_native._compiler()
    if cxx is None or not cpu_native.available():
        pytest.skip("no C++ compiler")
    flags = _cpu_flags()
    if variant == "avx512":
        extra = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
        path = cpu_native.build(cxx, extra)  # compiles on any x86-64 compiler
        assert path.is_file()
        if "avx512f" not in flags:
            return
    else:
        if variant == "avx2" and not {"avx2", "fma"} <= flags:
            pytest.skip("CPU without AVX2+FMA")
        path = cpu_native.build(cxx, VARIANTS[variant])
    lib = cpu_native.open_library(path)
    assert cpu_int4.isa(lib) == variant
    monkeypatch.setattr(cpu_native, "_lib", lib)
    for m, k, n, group in SHAPES[:5]:
        _, x, b, q, packed = _case(m, k, n, group, bias=True, seed=m)
        exp = _oracle(x, q, b, group)
        y = cpu_int4.int4_linear(x, packed, b)
        assert (y.double() - exp).abs().max().item() <= 2e-5 * exp.abs().max().item(), (variant, m, k, n)
    # The prefill-sized path's native dequantization, in this build too.
    _, x, b, q, packed = _case(cpu_int4.DIRECT_MAX_ROWS + 3, 130, 33, 64, bias=True)
    exp = _oracle(x, q, b, 64)
    assert (cpu_int4.int4_linear(x, packed, b).double() - exp).abs().max().item() <= 2e-5 * exp.abs().max().item()


def test_native_kernel_result_does_not_depend_on_threads_or_batch():
    """Each output column is summed by one thread in one order, and each row on its own: the
    batch-invariant wrapper (fixed 16-row tiles) then holds for int4 as for the float linear."""
    _, x, b, _, packed = _case(11, 200, 45, 64, bias=True)
    ops = get_kernel_ops("cpu")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.int4_linear(x, packed, b)
        torch.set_num_threads(2)
        two = ops.int4_linear(x, packed, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    inv = batch_invariant_ops(ops)
    alone = inv.int4_linear(x[4:5], packed, b)
    assert torch.equal(inv.int4_linear(x, packed, b)[4:5], alone)
    big = torch.cat([x, torch.randn(30, 200)])  # 41 rows: past DIRECT_MAX_ROWS unwrapped
    assert torch.equal(inv.int4_linear(big, packed, b)[4:5], alone)
