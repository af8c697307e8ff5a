"""Batch-invariant ops: a row's result does not depend on which other rows share the call.

Why: the library GEMMs pick their blocking, and so the order in which a dot product is summed, from
the number of rows M. Measured on this project's CPU (AMD EPYC, AVX512-BF16, torch 2.13): MKL's
float32 ``F.linear`` gives row 0 different bits at M = 1, 2 and >= 16; the native float32 kernel
hands over to MKL above 64 rows; and the prefill attention takes another path for a chunk by its
size (bf16 on AVX512-BF16: the prompt kernel from 16 rows, the paged tile below; elsewhere torch's
SDPA for a whole prompt of >= 64 tokens), and how a prompt is chunked depends on the decodes it
shares the step with. A sampled token near a tie then differs between a request
served alone and the same request in a batch (issue 36: the same ``seed``, other text).

What this wraps, as vLLM's ``VLLM_BATCH_INVARIANT`` and SGLang's deterministic inference do on
GPUs (fixed-split kernels), here for the native CPU ops:

* ``linear`` / ``int8_linear`` / ``int4_linear``: rows in fixed tiles of ``ROW_TILE`` (the last one zero-padded), so
  every row is computed by a call of the same shape. A GEMM of a fixed shape sums each row the same
  way whatever the other rows hold and wherever in the tile it sits (``tests/kernels/
  test_batch_invariant.py`` checks both, against the plain op that does not hold it).
* ``paged_prefill_attention``: always the native kernel's two-pass tile, which computes each query
  row on its own (its scores, softmax and weighted sum over the row's own context, in position
  order), so chunk boundaries and neighbours change nothing.
* ``paged_decode_attention``: the same two-pass tile, not the AVX-512 decode tile (an online
  softmax that rounds differently): a decoded position must have the bits it gets when a preempted
  sequence is recomputed in a prefill chunk, and a 1-token chunk must not take another path than
  the rows of a longer one.
* SGMV: per row (the native SGMV sums a token's dot products in one order whatever its group
  holds) once prompt-sized groups stay off the vdpbf16ps tiles (``prompt_groups=False``: those
  round the shrunk activations to bf16, so a prompt's token would differ from the same token
  decoded alone). KV writes: already per row.

Only the native CPU backend (``cpu``) is wrapped: the torch reference gathers padded batches for
SDPA and Triton's split-KV depends on the grid, so ``batch_invariant_ops`` refuses them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from . import cpu_native, cpu_sgmv
from .int4 import Int4Weight
from .ops import (
    Int4Linear,
    Int8Linear,
    KernelOps,
    Linear,
    PagedDecodeAttention,
    PagedPrefillAttention,
    SgmvExpand,
    SgmvShrink,
)

ROW_TILE = 16  # rows per GEMM call: small enough that a decode batch pads little


def _tiles(x: torch.Tensor) -> list[torch.Tensor]:
    """``x`` [M, K] cut into [ROW_TILE, K] tiles; the last one zero-padded (a fresh tensor)."""
    tiles = list(x.split(ROW_TILE))
    last = tiles[-1]
    if last.shape[0] < ROW_TILE:
        padded = last.new_zeros((ROW_TILE, last.shape[1]))
        padded[: last.shape[0]] = last
        tiles[-1] = padded
    return tiles


def _by_tiles(x: torch.Tensor, apply: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``apply`` on fixed-size row tiles of ``x`` (flattened to 2-D), the rows put back in order."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0:
        return apply(x)
    out = torch.cat([apply(t.contiguous()) for t in _tiles(x2)])[:m]
    return out.reshape(*lead, out.shape[-1])


def tiled_linear(linear: Linear) -> Linear:
    def run(
        x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, packed: torch.Tensor | None
    ) -> torch.Tensor:
        return _by_tiles(x, lambda t: linear(t, weight, bias, packed))

    return run


def tiled_int8_linear(int8_linear: Int8Linear) -> Int8Linear:
    def run(
        x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _by_tiles(x, lambda t: int8_linear(t, qweight, scales, bias))

    return run


def tiled_int4_linear(int4_linear: Int4Linear) -> Int4Linear:
    def run(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _by_tiles(x, lambda t: int4_linear(t, weight, bias))

    return run


# The native attention with every row on the per-row two-pass tile: whole prompts not on SDPA, decode
# rows not on the decode tile (a position has the same bits decoded or recomputed in a prefill).
native_prefill_attention: PagedPrefillAttention = functools.partial(
    cpu_native.paged_prefill_attention, whole_prompt_sdpa=False, decode_tile=False
)
native_decode_attention: PagedDecodeAttention = functools.partial(cpu_native.paged_decode_attention, decode_tile=False)
# The SGMV with every group on the per-token loops (no prompt-group tiles).
per_token_sgmv_shrink: SgmvShrink = functools.partial(cpu_sgmv.sgmv_shrink, prompt_groups=False)
per_token_sgmv_expand: SgmvExpand = functools.partial(cpu_sgmv.sgmv_expand, prompt_groups=False)


class BatchInvariantUnsupported(ValueError):
    """The chosen kernels cannot compute a row independently of its batch."""


def batch_invariant_ops(ops: KernelOps) -> KernelOps:
    """``ops`` with every op whose per-row result depends on the batch replaced (see above)."""
    if ops.name != "cpu":
        raise BatchInvariantUnsupported(
            f"batch_invariant needs the native CPU kernels (kernel_backend 'auto' or 'cpu' on a CPU with a "
            f"C++ compiler); this engine runs {ops.name!r}"
        )
    return dataclasses.replace(
        ops,
        name="cpu+batch_invariant",
        linear=tiled_linear(ops.linear),
        int8_linear=tiled_int8_linear(ops.int8_linear),
        int4_linear=tiled_int4_linear(ops.int4_linear),
        # w8a8_linear stays as it is: per-row quantizer, exact integer GEMM, per-element epilogue,
        # so a row's result is already independent of its batch (tests/kernels/test_kernels_w8a8.py).
        paged_prefill_attention=native_prefill_attention,
        paged_decode_attention=native_decode_attention,
        sgmv_shrink=per_token_sgmv_shrink,
        sgmv_expand=per_token_sgmv_expand,
    )
