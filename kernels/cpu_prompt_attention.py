"""Prompt chunks' causal attention (a whole prompt, or a chunk after cached positions: the later
chunks of a chunked prompt, a prompt after a prefix-cache hit; the chunk's KV already in the paged
cache): the Python side of ``csrc/cpu_prompt_attention.cpp`` (bf16 on a CPU with AVX512-BF16, all
of a step's prompt chunks in one call) and the whole prompts' fallback, torch's SDPA (one batched
call per prompt length). ``cpu_native.paged_prefill_attention`` decides which chunks go where; the
library comes from ``cpu_native.load()``."""

from __future__ import annotations

import ctypes

import torch

from .profiler_range import profiler_range


def kernel_isa(lib: ctypes.CDLL | None) -> bool:
    """True when the built kernels have the vdpbf16ps whole-prompt attention (AVX512-BF16)."""
    return lib is not None and bool(lib.lp_prompt_attention_isa())


def applies(q: torch.Tensor, lib: ctypes.CDLL | None) -> bool:
    """Whole prompts of ``q`` take the native prompt kernel: bf16, head dim a multiple of 16 (the
    pair panels of V^T), heads adjacent in a row, and a build with AVX512-BF16."""
    return (
        q.dtype == torch.bfloat16
        and q.shape[2] % 16 == 0
        and q.stride(2) == 1
        and q.stride(1) == q.shape[2]
        and kernel_isa(lib)
    )


def attend(
    q: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seqs: list[int],
    row_starts: list[int],
    lens: list[int],
    scale: float,
    *,
    lib: ctypes.CDLL,
    offsets: list[int] | None = None,
) -> None:
    """Causal attention of prompt chunks (sequence ``seqs[i]``'s chunk is rows ``row_starts[i]`` ..
    + ``lens[i]`` of ``q``, at positions ``offsets[i]`` .. of its sequence; no offsets: whole
    prompts), written into the same rows of ``out``, in one native call."""
    bt = block_tables.to(torch.int32).contiguous()
    table_rows = torch.tensor(seqs, dtype=torch.int32)
    starts = torch.tensor(row_starts, dtype=torch.int32)
    lengths = torch.tensor(lens, dtype=torch.int32)
    offs = torch.tensor(offsets, dtype=torch.int32) if offsets is not None and any(offsets) else None
    with profiler_range("loraplex::cpu_prompt_attention"):
        lib.lp_prompt_attention_bf16(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            bt.data_ptr(),
            bt.shape[1],
            table_rows.data_ptr(),
            starts.data_ptr(),
            lengths.data_ptr(),
            None if offs is None else offs.data_ptr(),
            len(seqs),
            out.data_ptr(),
            out.stride(0),
            q.shape[1],
            k_cache.shape[2],
            q.shape[2],
            k_cache.shape[1],
            float(scale),
            torch.get_num_threads(),
        )


def fresh_sdpa(
    q: torch.Tensor,
    rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seqs: list[int],
    length: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ``seqs`` (each a whole prompt of ``length`` tokens, KV already in the
    cache) in one batched SDPA call; the rows of ``rows`` order, [len(seqs) * length, hq, d]."""
    n, (_, bs, hkv, d), hq = len(seqs), k_cache.shape, q.shape[1]
    blocks = block_tables[seqs, : -(-length // bs)].long()  # [n, blocks]
    k = k_cache[blocks].reshape(n, -1, hkv, d)[:, :length].transpose(1, 2)  # [n, hkv, L, d]
    v = v_cache[blocks].reshape(n, -1, hkv, d)[:, :length].transpose(1, 2)
    qs = q.index_select(0, rows).view(n, length, hq, d).transpose(1, 2)
    with profiler_range("loraplex::cpu_prefill_sdpa"):
        o = torch.nn.functional.scaled_dot_product_attention(
            qs, k, v, is_causal=True, scale=scale, enable_gqa=hq != hkv
        )
    return o.transpose(1, 2).reshape(n * length, hq, d)
