"""The native whole-prompt attention (``csrc/cpu_prompt_attention.cpp``: causal attention of prompt
chunks that are whole prompts, bf16, vdpbf16ps over pair panels) against the float64 oracle: prompt
lengths below, at and across its 64-row work blocks and the 16-key panels (odd ones too), GQA groups
1/3/4/8, head dims 64/80/128, block sizes 8/16/32, query rows read through a strided view (the fused
qkv projection's); rows that do not depend on the call's other prompts or the thread count; the
portable twin (a build without AVX512-BF16) on any CPU; what stays on SDPA."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import PagedKV, assert_close_scaled, oracle_attention

from loraplex.kernels import cpu_native, cpu_prompt_attention

# (block_size, q heads, kv heads, head dim): SmolLM2's 9/3 x 64, Llama-like 8/2 x 128, no GQA at 80
# (5 panels: a group of 3 and one of 2), MQA with 8 heads.
CONFIGS = [(16, 9, 3, 64), (32, 8, 2, 128), (8, 4, 4, 80), (16, 8, 1, 64)]
LENGTHS = [[64], [65, 128, 97], [129, 200], [301]]


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _case(lengths, bs, hq, hkv, d, seed):
    """Whole prompts of ``lengths`` in a paged cache, their queries as the q columns of a fused
    [rows, hq + 2 hkv, d] projection (a strided view, as the model passes them)."""
    kv = PagedKV(lengths, bs, hkv, d, torch.bfloat16, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(sum(lengths), hq + 2 * hkv, d, generator=g).to(torch.bfloat16)
    q = qkv[:, :hq]
    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return kv, q, qsl


def _chunk_case(ctx_lens, q_lens, bs, hq, hkv, d, seed):
    """Chunks over cached positions: sequence s's last ``q_lens[s]`` positions of ``ctx_lens[s]``
    (a chunked prompt's later chunk, or a prompt after a prefix-cache hit), q strided as above."""
    kv = PagedKV(ctx_lens, bs, hkv, d, torch.bfloat16, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(sum(q_lens), hq + 2 * hkv, d, generator=g).to(torch.bfloat16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return kv, qkv[:, :hq], qsl


def _expected(kv, q, qsl, scale):
    return torch.cat(
        [
            oracle_attention(q[qsl[s] : qsl[s + 1]], kv.keys[s], kv.values[s], c, scale)
            for s, c in enumerate(kv.ctx_lens)
        ]
    )


def _needs_isa():
    if not cpu_native.prompt_kernel_isa():
        pytest.skip("this CPU has no AVX512-BF16 (the portable twin's test covers the layout)")


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"bs{c[0]}-h{c[1]}x{c[2]}-d{c[3]}")
def test_prompt_kernel_matches_the_float64_oracle(cfg, lengths, monkeypatch):
    _needs_isa()
    bs, hq, hkv, d = cfg
    kv, q, qsl = _case(lengths, bs, hkv=hkv, hq=hq, d=d, seed=len(lengths) * 7 + d)
    assert cpu_native.prompt_kernel_applies(q) and not q.is_contiguous()
    calls = []
    real = cpu_prompt_attention.attend
    monkeypatch.setattr(cpu_prompt_attention, "attend", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    scale = d**-0.5
    out = cpu_native.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    assert calls == [list(range(len(lengths)))]  # every prompt in one call
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert_close_scaled(out, _expected(kv, q, qsl, scale), torch.bfloat16, f"prompt kernel {cfg} {lengths}")


# (context lengths, chunk lengths): a 128-token prompt's second 64-token chunk, chunks not a multiple
# of the 64-row items or the 16-key panels, a chunk at the threshold, whole prompts beside chunks in
# one call, a long prefix (the keys of several items).
CHUNKS = [
    ([128], [64]),
    ([200, 77], [72, 16]),
    ([130, 96, 64], [33, 96, 64]),
    ([1030], [129]),
]


@pytest.mark.parametrize("case", CHUNKS, ids=lambda c: "-".join(f"{q}of{n}" for n, q in zip(*c)))
@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=lambda c: f"bs{c[0]}-h{c[1]}x{c[2]}-d{c[3]}")
def test_chunks_over_cached_positions_match_the_oracle(cfg, case, monkeypatch):
    """A chunk's row i is position ctx - len + i and sees every cached key before the chunk: rows
    that saw only the chunk's own keys (a whole-prompt mask), or one key too many, fail here."""
    _needs_isa()
    ctx_lens, q_lens = case
    bs, hq, hkv, d = cfg
    kv, q, qsl = _chunk_case(ctx_lens, q_lens, bs, hq, hkv, d, seed=sum(ctx_lens) + d)
    calls = []
    real = cpu_prompt_attention.attend
    monkeypatch.setattr(cpu_prompt_attention, "attend", lambda *a, **k: calls.append(sorted(a[5])) or real(*a, **k))
    scale = d**-0.5
    out = cpu_native.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    assert calls == [list(range(len(ctx_lens)))]  # chunks and whole prompts in one call
    assert_close_scaled(out, _expected(kv, q, qsl, scale), torch.bfloat16, f"chunks {cfg} {case}")


def test_short_chunks_and_the_switch_stay_on_the_paged_tile(monkeypatch):
    """A chunk over cached positions shorter than KERNEL_MIN_ROWS, and every chunk under
    ``prompt_kernel=False`` / ``whole_prompt_sdpa=False`` (the batch-invariant ops), run the native
    paged tile; the results are the oracle's either way."""
    _needs_isa()
    short = cpu_native.KERNEL_MIN_ROWS - 1
    kv, q, qsl = _chunk_case([100, 90], [short, 40], 16, 9, 3, 64, seed=11)
    calls = []
    real = cpu_prompt_attention.attend
    monkeypatch.setattr(cpu_prompt_attention, "attend", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    for kw, expect in (({}, [[1]]), ({"prompt_kernel": False}, []), ({"whole_prompt_sdpa": False}, [])):
        calls.clear()
        out = cpu_native.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, 0.125, **kw
        )
        assert calls == expect, kw
        assert_close_scaled(out, _expected(kv, q, qsl, 0.125), torch.bfloat16, f"short chunk {kw}")


def test_rows_do_not_depend_on_the_other_prompts_or_the_threads():
    """A prompt's rows have the same bits computed alone, beside other prompts (in another order of
    work items) and at one thread: no arithmetic depends on the call's shape."""
    _needs_isa()
    bs, hq, hkv, d = 16, 9, 3, 64
    kv, q, qsl = _case([150, 70, 129], bs, hq, hkv, d, seed=5)
    scale = 0.125
    both = cpu_native.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = cpu_native.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, scale
        )
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(both, single)
    for s in range(3):
        rows = slice(int(qsl[s]), int(qsl[s + 1]))
        alone = cpu_native.paged_prefill_attention(
            q[rows],
            kv.k_cache,
            kv.v_cache,
            kv.block_tables[s : s + 1],
            torch.tensor([0, rows.stop - rows.start], dtype=torch.int32),
            kv.context_lens[s : s + 1],
            scale,
        )
        assert torch.equal(alone, both[rows]), f"prompt {s}"


def test_portable_twin_matches_the_oracle(monkeypatch):
    """A build without AVX512-BF16 runs the scalar twin on the same packed layouts: the oracle's
    numbers on any CPU; it reports no kernel, so whole prompts then take SDPA."""
    cxx = cpu_native._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512bf16",)))
    assert lib.lp_prompt_attention_isa() == 0
    monkeypatch.setattr(cpu_native, "_lib", lib)
    monkeypatch.setattr(cpu_native, "_tried", True)
    for (bs, hq, hkv, d), lengths in (((16, 9, 3, 64), [64, 97]), ((8, 4, 4, 80), [130])):
        kv, q, qsl = _case(lengths, bs, hq, hkv, d, seed=d)
        out = torch.full_like(q, float("nan")).contiguous()
        starts = qsl[:-1].tolist()
        cpu_prompt_attention.attend(
            q, out, kv.k_cache, kv.v_cache, kv.block_tables, [0, 1][: len(lengths)], starts, lengths, 0.1, lib=lib
        )
        assert_close_scaled(out, _expected(kv, q, qsl, 0.1), torch.bfloat16, f"portable {lengths}")
    kv, qc, qsl = _chunk_case([150], [70], 16, 9, 3, 64, seed=3)
    out = torch.full_like(qc, float("nan")).contiguous()
    cpu_prompt_attention.attend(
        qc, out, kv.k_cache, kv.v_cache, kv.block_tables, [0], [0], [70], 0.1, lib=lib, offsets=[80]
    )
    assert_close_scaled(out, _expected(kv, qc, qsl, 0.1), torch.bfloat16, "portable chunk 70 of 150")
    kv, q, qsl = _case([130], 8, 4, 4, 80, seed=80)
    assert not cpu_native.prompt_kernel_isa() and not cpu_native.prompt_kernel_applies(q)
    calls = []
    real = cpu_prompt_attention.fresh_sdpa
    monkeypatch.setattr(cpu_prompt_attention, "fresh_sdpa", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    cpu_native.paged_prefill_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, 0.1)
    assert calls == [[0]]


def test_what_stays_on_sdpa(monkeypatch):
    """float32, a head dim that is not a multiple of 16 (no whole V^T panels) and the benchmarks'
    switch keep whole prompts on SDPA; every result still the oracle's."""
    _needs_isa()
    calls = []
    real = cpu_prompt_attention.fresh_sdpa
    monkeypatch.setattr(cpu_prompt_attention, "fresh_sdpa", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    for dtype, d, switch in ((torch.float32, 64, True), (torch.bfloat16, 40, True), (torch.bfloat16, 64, False)):
        kv = PagedKV([80], 16, 2, d, dtype, seed=d)
        q = torch.randn(80, 4, d).to(dtype)
        qsl = torch.tensor([0, 80], dtype=torch.int32)
        calls.clear()
        out = cpu_native.paged_prefill_attention(
            q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, kv.context_lens, 0.125, prompt_kernel=switch
        )
        assert calls == [[0]], (dtype, d, switch)
        assert_close_scaled(out, oracle_attention(q, kv.keys[0], kv.values[0], 80, 0.125), dtype, f"sdpa {dtype} {d}")
