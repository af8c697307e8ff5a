"""The native CPU paged attention (``kernels/cpu_native.py``, C++ built on first use) against the
dense float64 oracle and the torch reference, over the same layouts as the Triton tests."""

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

from loraplex.kernels import cpu_native, cpu_prompt_attention, get_kernel_ops, reference


@pytest.fixture(scope="module", autouse=True)
def native():
    # CI machines have a C++ compiler: a failed build is a failure here, not a skip.
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


@pytest.mark.parametrize("cfg", ATTENTION_CONFIGS, ids=attention_config_id)
def test_native_decode_matches_oracle(cfg):
    bs, hq, hkv, d, dtype = cfg
    kv = PagedKV(decode_context_lens(bs), bs, hkv, d, dtype, seed=21)
    q = torch.randn(len(kv.ctx_lens), hq, d).to(dtype)
    scale = 1 / math.sqrt(d)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, scale)
    out = cpu_native.paged_decode_attention(*args)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close_scaled(out, decode_expected(kv, q, scale), dtype, "native decode")
    assert_close_scaled(out, reference.paged_decode_attention(*args), dtype, "native decode vs reference")


@pytest.mark.parametrize("cfg", ATTENTION_CONFIGS, ids=attention_config_id)
def test_native_prefill_matches_oracle(cfg):
    kv, q, qsl, scale, expected = prefill_case(cfg, seed=22)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    out = cpu_native.paged_prefill_attention(*args)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close_scaled(out, expected, cfg[-1], "native prefill")
    assert_close_scaled(out, reference.paged_prefill_attention(*args), cfg[-1], "native prefill vs reference")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_long_contexts_and_odd_group(dtype):
    """Contexts of hundreds of tokens over shuffled blocks, a GQA group of 7 (Qwen2-7B-like),
    head dim 80, several prefill chunks crossing the kernel's row tiles."""
    bs, hq, hkv, d = 16, 14, 2, 80
    kv = PagedKV([700, 1, 333, 96], bs, hkv, d, dtype, seed=23)
    q = torch.randn(4, hq, d).to(dtype)
    out = cpu_native.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.1)
    assert_close_scaled(out, decode_expected(kv, q, 0.1), dtype, "long decode")
    qlens = [70, 1, 33, 96]
    qsl = torch.tensor([0, 70, 71, 104, 200], dtype=torch.int32)
    qp = torch.randn(200, hq, d).to(dtype)
    out = cpu_native.paged_prefill_attention(qp, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, 0.1)
    expected = torch.cat(
        [oracle_attention(qp[qsl[s] : qsl[s + 1]], kv.keys[s], kv.values[s], c, 0.1) for s, c in enumerate(kv.ctx_lens)]
    )
    assert sum(qlens) == 200
    assert_close_scaled(out, expected, dtype, "long prefill")


def test_native_uses_all_threads_deterministically():
    """The OpenMP split must not change results: 1 thread and the default give identical bits."""
    kv = PagedKV([50, 120, 7, 300, 64, 33], 16, 2, 64, torch.bfloat16, seed=24)
    q = torch.randn(6, 8, 64).to(torch.bfloat16)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_native.paged_decode_attention(*args)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, cpu_native.paged_decode_attention(*args))


def test_dispatch_auto_picks_native_on_cpu():
    ops = get_kernel_ops("auto", "cpu")
    assert ops.name == "cpu"
    assert ops.paged_decode_attention is cpu_native.paged_decode_attention
    assert get_kernel_ops("torch", "cpu").paged_decode_attention is reference.paged_decode_attention
    assert get_kernel_ops("cpu", "cpu").paged_prefill_attention is cpu_native.paged_prefill_attention


# A full compile of the native CPU kernel library into an empty cache (the C++ compiler for 10-35 s):
# the inner loop loads the library from the per-machine cache like every other test.
@pytest.mark.slow
def test_build_is_cached_and_keyed_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cxx = cpu_native._compiler()
    assert cxx is not None
    path = cpu_native.build(cxx)
    assert path.is_file() and path.parent == tmp_path / "loraplex" / "kernels"
    mtime = path.stat().st_mtime_ns
    assert cpu_native.build(cxx) == path and path.stat().st_mtime_ns == mtime  # no rebuild


@pytest.mark.parametrize("prompt_kernel", [True, False], ids=["prompt-kernel", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_prompt_chunks_take_sdpa_and_match_oracle(dtype, prompt_kernel, monkeypatch):
    """In bf16 where the build has AVX512-BF16, every chunk of at least ``KERNEL_MIN_ROWS`` rows
    (the whole prompts and the chunk over a cached prefix) goes to the native prompt kernel in one
    call; otherwise whole prompts of at least ``SDPA_MIN_ROWS`` tokens go to batched causal SDPA
    (two of one length share a call, a third length gets its own) and the chunk over a prefix to
    the paged tile. A short whole prompt, a decode row and a sequence with no query stay on the
    paged tile either way; every row against the float64 oracle, in the caller's row order."""
    bs, hq, hkv, d, m = 16, 9, 3, 64, cpu_native.SDPA_MIN_ROWS
    # (query_len, context_len): fresh m, fresh m + 21 (two), over a prefix, short fresh, decode, none.
    layout = [(m, m), (m + 21, m + 21), (40, 40 + m), (m + 21, m + 21), (5, 5), (1, 77), (0, 30), (m, m)]
    kv = PagedKV([c for _, c in layout], bs, hkv, d, dtype, seed=31)
    qsl = [0]
    for n, _ in layout:
        qsl.append(qsl[-1] + n)
    q = torch.randn(qsl[-1], hq, d).to(dtype)
    sdpa_calls, kernel_calls = [], []
    real_sdpa, real_kernel = cpu_prompt_attention.fresh_sdpa, cpu_prompt_attention.attend
    monkeypatch.setattr(
        cpu_prompt_attention, "fresh_sdpa", lambda *a, **k: sdpa_calls.append(a[5]) or real_sdpa(*a, **k)
    )
    monkeypatch.setattr(
        cpu_prompt_attention, "attend", lambda *a, **k: kernel_calls.append(a[5]) or real_kernel(*a, **k)
    )
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, torch.tensor(qsl, dtype=torch.int32), kv.context_lens, 0.125)
    out = cpu_native.paged_prefill_attention(*args, prompt_kernel=prompt_kernel)
    if prompt_kernel and dtype == torch.bfloat16 and cpu_native.prompt_kernel_isa():
        assert sorted(map(sorted, kernel_calls)) == [[0, 1, 2, 3, 7]] and sdpa_calls == []
    else:
        assert sorted(map(sorted, sdpa_calls)) == [[0, 7], [1, 3]] and kernel_calls == []
    expected = torch.cat(
        [
            oracle_attention(q[qsl[s] : qsl[s + 1]], kv.keys[s], kv.values[s], c, 0.125)
            for s, (_, c) in enumerate(layout)
        ]
    )
    assert out.dtype == dtype and out.shape == q.shape
    assert_close_scaled(out, expected, dtype, "prefill with whole-prompt chunks")
