// Grouped SGMV (LoRA shrink and expand) for CPU serving: the step's tokens are grouped by adapter
// slot, and each adapter's A rows / B rows are streamed once per group of tokens (the tokens of a
// group share every weight load, register-blocked 4 at a time) instead of being gathered (copied)
// once per token as the torch path does.
//
// Built with cpu_attention.cpp into one library by kernels/cpu_native.py (same flags, same libgomp
// as torch), called through ctypes.
//
// Layouts (match kernels/reference.py):
//   x:        [num_tokens, hidden]              (rows may be strided: x_stride elements apart)
//   lora_a:   [num_slices, num_slots, max_rank, hidden]
//   shrunk:   float32 [num_slices, num_tokens, max_rank]   (zeros beyond each slot's rank: the
//             caller passes a zeroed buffer; only columns < rank are written)
//   lora_b:   [num_slots, max_rank, total_out]
//   y:        [num_tokens, total_out]          (updated in place: y += scale[s] * shrunk @ B)
//   groups:   group g = tokens token_idx[group_start[g] .. group_start[g+1]) of slot group_slot[g]
//
// Dtypes: activations (x, y) float32 or bf16; adapter weights (A, B) float32, bf16 or float16 --
// float16 storage beside a float32 model halves the bytes a step streams (the decode step over
// many adapters is bound by them), converted in registers (AVX-512 vcvtph2ps; bf16 is a shift).
// Accumulation is always fp32. Without AVX-512 the same loops run in portable C++ (the compiler
// vectorises what it can; float16 converts with F16C where present, else bit arithmetic).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>
#include <omp.h>

#include "pair_panel_dot.h"  // LP_DP_BF16 where the build has AVX512-BF16
#if defined(__AVX512F__)
#include <immintrin.h>
#define LP_SGMV_AVX512 1
#elif defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

struct Bf16 {
    uint16_t v;
};
struct F16 {
    uint16_t v;
};

inline float to_f(float x) { return x; }
inline float to_f(Bf16 x) {
    uint32_t u = static_cast<uint32_t>(x.v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float to_f(F16 h) {
#if defined(__F16C__)
    return _cvtsh_ss(h.v);
#else
    // IEEE binary16 -> binary32 by bit arithmetic (the no-F16C fallback).
    const uint32_t sign = static_cast<uint32_t>(h.v & 0x8000u) << 16;
    uint32_t exp = (h.v >> 10) & 0x1fu, man = h.v & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);  // inf / NaN
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            man <<= 1;
            ++e;
        } while (!(man & 0x400u));
        u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}
inline void from_f(float x, float* dst) { *dst = x; }
inline void from_f(float x, Bf16* dst) {
    // Branch-free (a select, not a jump) so the row update loop vectorises.
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even, like torch
    const uint32_t nan = (u >> 16) | 0x40u;                             // quiet NaN keeps its sign
    dst->v = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#if LP_SGMV_AVX512
inline __m512 vload(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 vload(const Bf16* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline __m512 vload(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// The last n < 16 elements: through a zero-padded copy (no masked 16-bit loads needed).
template <typename T>
inline __m512 vload_tail(const T* p, int n) {
    T buf[16];
    std::memset(buf, 0, sizeof(buf));
    std::memcpy(buf, p, sizeof(T) * n);
    return vload(buf);
}
#endif

constexpr int kTokenTile = 32;   // tokens of one group per work item (parallelism for long prefill groups)
constexpr int kTokenBlock = 4;   // tokens sharing each weight load (register blocking)
constexpr int kExpandCols = 1024;  // B columns per work item: 4 tokens x 1024 fp32 accumulators stay in L1

struct Item {
    int group, tile, part;  // part: slice (shrink) or column chunk (expand)
};

// Software prefetch: a row pass prefetches the rows kPrefetchRows ahead of it (the same columns),
// and the last passes of a work item the first rows of the NEXT item in the list, so the memory
// stream does not stall at every item boundary (a decode step over many adapters is 64 items of
// one token per kernel, each 18-100 KB of weights). Measured (benchmarks/kernels/cpu_sgmv.py, cold
// weights): 4 rows ahead = 8 = 16, 2 rows slower. Prefetches never fault, so rows past the last
// item need no guard.
#ifndef LP_PREFETCH_ROWS
#define LP_PREFETCH_ROWS 4
#endif
constexpr int kPrefetchRows = LP_PREFETCH_ROWS;

// Row k of an item (rows 0..rank of `base`, `stride` elements apart), rows past the item's rank
// continuing into the next item's rows (`next`, same stride; the current rows again if none).
template <typename TW>
inline const TW* row_or_next(const TW* base, const TW* next, int64_t stride, int rank, int k) {
    if (k < rank) return base + static_cast<int64_t>(k) * stride;
    return next ? next + static_cast<int64_t>(k - rank) * stride : base;
}

#if LP_SGMV_AVX512
// One prefetch per 64-byte line of a row segment being streamed 16 elements at a time.
// Into L2 (T1), not L1: measured, T0 prefetches (the previous kernel's 1 KB ahead, or rows ahead)
// left the stream at ~8 GB/s from memory, T1 at ~13-16 GB/s (the L1 streamer takes it from L2).
template <typename TW>
inline void prefetch_line(const TW* p, int i) {
    if (sizeof(TW) == 4 || (i & 31) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T1);
}
#endif

// out[j][r] = x_j . a_r for r < rank, NB tokens at once (each A row loaded once for all of them).
// RB = 2 A rows per pass: 2 x NB independent FMA chains and two streams in flight (4 rows per
// pass for 1-2 tokens measured no faster once the prefetches went to L2). Each (token, row) dot
// product is summed in the same order whatever NB is (batch invariance).
template <int NB, bool PF, typename TX, typename TW>
inline void shrink_block(const TX* const* xr, const TW* a, int rank, int hidden, float* const* out,
                         const TW* next) {
    int r = 0;
#if LP_SGMV_AVX512
    constexpr int RB = 2;
    for (; r + RB <= rank; r += RB) {
        const TW* ar[RB];
        const TW* pf[RB];
        for (int q = 0; q < RB; ++q) {
            ar[q] = a + static_cast<int64_t>(r + q) * hidden;
            pf[q] = row_or_next(a, next, hidden, rank, r + q + kPrefetchRows);
        }
        __m512 acc[RB][NB];
        for (int q = 0; q < RB; ++q)
            for (int j = 0; j < NB; ++j) acc[q][j] = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= hidden; i += 16) {
            __m512 w[RB];
            for (int q = 0; q < RB; ++q) {
                if (PF) prefetch_line(pf[q], i);
                w[q] = vload(ar[q] + i);
            }
            for (int j = 0; j < NB; ++j) {
                const __m512 xv = vload(xr[j] + i);
                for (int q = 0; q < RB; ++q) acc[q][j] = _mm512_fmadd_ps(w[q], xv, acc[q][j]);
            }
        }
        if (i < hidden) {
            __m512 w[RB];
            for (int q = 0; q < RB; ++q) w[q] = vload_tail(ar[q] + i, hidden - i);
            for (int j = 0; j < NB; ++j) {
                const __m512 xv = vload_tail(xr[j] + i, hidden - i);
                for (int q = 0; q < RB; ++q) acc[q][j] = _mm512_fmadd_ps(w[q], xv, acc[q][j]);
            }
        }
        for (int j = 0; j < NB; ++j)
            for (int q = 0; q < RB; ++q) out[j][r + q] = _mm512_reduce_add_ps(acc[q][j]);
    }
#else
    (void)next;
#endif
    for (; r < rank; ++r) {
        const TW* ar = a + static_cast<int64_t>(r) * hidden;
        for (int j = 0; j < NB; ++j) {
            const TX* x = xr[j];
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < hidden; ++i) dot += to_f(ar[i]) * to_f(x[i]);
            out[j][r] = dot;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prompt-sized groups in bf16 (activations and adapter weights bf16, AVX512-BF16): a group of at
// least dp_min consecutive tokens of one adapter (a prompt chunk) runs as two small GEMMs on the
// linear kernel's vdpbf16ps tiles (pair_panel_dot.h) instead of the per-token fp32 FMA loops above,
// which are built for decode groups of 1-4 tokens (~70-85 GFLOP/s on a 128-token prompt against
// ~400 for the same shapes packed). The A rows (shrink) and the B column chunk (expand) are packed
// into pair panels per work item (a few KB, cheap beside the item's 16-32 tokens x hidden x rank
// products). The shrunk activations are rounded to bf16 for the expand product (PEFT's bf16 layers
// round them too); a token in such a group therefore gets other bits than the same token decoded
// alone, so the batch-invariant ops turn these paths off (dp_min = 0).
#if defined(LP_DP_BF16)
inline bool consecutive(const int32_t* token_idx, int t0, int t1) {
    for (int t = t0 + 1; t < t1; ++t)
        if (token_idx[t] != token_idx[t0] + (t - t0)) return false;
    return true;
}

template <int R, int NP>
inline void shrink_tile_dp(const uint16_t* x, int64_t xs, int k2, const uint16_t* w, int64_t pe, int p0, int rank,
                           float* out, int max_rank) {
    __m512 acc[R][NP];
    lp_pair::dot<R, NP>(acc, x, xs, k2, w + p0 * pe, pe);
    for (int j = 0; j < NP; ++j) {
        const int c = (p0 + j) * lp_pair::kPanel, left = rank - c;
        const __mmask16 m = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
        for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + static_cast<int64_t>(r) * max_rank + c, m, acc[r][j]);
    }
}

template <int R>
inline void shrink_rows_dp_r(const uint16_t* x, int64_t xs, int k2, const uint16_t* w, int64_t pe, int np, int rank,
                             float* out, int max_rank) {
    int p = 0;
    for (; p + 3 <= np; p += 3) shrink_tile_dp<R, 3>(x, xs, k2, w, pe, p, rank, out, max_rank);
    if (np - p == 2) shrink_tile_dp<R, 2>(x, xs, k2, w, pe, p, rank, out, max_rank);
    if (np - p == 1) shrink_tile_dp<R, 1>(x, xs, k2, w, pe, p, rank, out, max_rank);
}

// out[t][0..rank) = x_t . A rows, for m consecutive rows of x (row stride xs); A: rank rows of hidden.
inline void shrink_rows_dp(const uint16_t* x, int64_t xs, int m, const uint16_t* a, int rank, int hidden, float* out,
                           int max_rank) {
    thread_local std::vector<uint16_t> panels;
    const int k2 = hidden / 2, np = (rank + lp_pair::kPanel - 1) / lp_pair::kPanel;
    const int64_t pe = static_cast<int64_t>(k2) * lp_pair::kPairElems;
    panels.resize(static_cast<size_t>(np) * pe);
    // Panel p, pair kk: lane j holds A[16p + j][2kk, 2kk + 1] (one 32-bit gather per pair; zero past rank).
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const int32_t* a32 = reinterpret_cast<const int32_t*>(a);
    for (int p = 0; p < np; ++p) {
        const int left = rank - p * lp_pair::kPanel;
        const __mmask16 live = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
        const __m512i rows = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(p * lp_pair::kPanel)),
                                                _mm512_set1_epi32(k2));
        for (int kk = 0; kk < k2; ++kk) {
            const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live,
                                                          _mm512_add_epi32(rows, _mm512_set1_epi32(kk)), a32, 4);
            _mm512_storeu_si512(panels.data() + p * pe + static_cast<int64_t>(kk) * lp_pair::kPairElems, v);
        }
    }
    int r = 0;
    for (; r + 8 <= m; r += 8) shrink_rows_dp_r<8>(x + r * xs, xs, k2, panels.data(), pe, np, rank, out + static_cast<int64_t>(r) * max_rank, max_rank);
    for (; r + 4 <= m; r += 4) shrink_rows_dp_r<4>(x + r * xs, xs, k2, panels.data(), pe, np, rank, out + static_cast<int64_t>(r) * max_rank, max_rank);
    for (; r < m; ++r) shrink_rows_dp_r<1>(x + r * xs, xs, k2, panels.data(), pe, np, rank, out + static_cast<int64_t>(r) * max_rank, max_rank);
}

template <int R, int NP>
inline void expand_tile_dp(const uint16_t* s, int k2, const uint16_t* w, int64_t pe, int p0, uint16_t* y, int64_t ys,
                           float scale) {
    __m512 acc[R][NP];
    lp_pair::dot<R, NP>(acc, s, 2 * k2, k2, w + p0 * pe, pe);
    const __m512 sv = _mm512_set1_ps(scale);
    for (int j = 0; j < NP; ++j)
        for (int r = 0; r < R; ++r) {
            uint16_t* yp = y + r * ys + (p0 + j) * lp_pair::kPanel;
            const __m512 yv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(yp))), 16));
            const __m256bh o = _mm512_cvtneps_pbh(_mm512_add_ps(yv, _mm512_mul_ps(sv, acc[r][j])));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(yp), reinterpret_cast<__m256i>(o));
        }
}

template <int R>
inline void expand_rows_dp_r(const uint16_t* s, int k2, const uint16_t* w, int64_t pe, int np, uint16_t* y, int64_t ys,
                             float scale) {
    int p = 0;
    for (; p + 3 <= np; p += 3) expand_tile_dp<R, 3>(s, k2, w, pe, p, y, ys, scale);
    if (np - p == 2) expand_tile_dp<R, 2>(s, k2, w, pe, p, y, ys, scale);
    if (np - p == 1) expand_tile_dp<R, 1>(s, k2, w, pe, p, y, ys, scale);
}

// y[t][0..w) += scale * s_t . B[:, 0..w) for m consecutive tokens (s: fp32 rows max_rank apart; B:
// rank rows b_stride apart; w a multiple of 16).
inline void expand_rows_dp(uint16_t* y, int64_t ys, const float* s, int max_rank, int m, const uint16_t* b,
                           int64_t b_stride, int rank, int w, float scale) {
    thread_local std::vector<uint16_t> s16, panels;
    const int k2 = (rank + 1) / 2, np = w / lp_pair::kPanel;
    const int64_t pe = static_cast<int64_t>(k2) * lp_pair::kPairElems;
    s16.resize(static_cast<size_t>(m) * 2 * k2);
    for (int t = 0; t < m; ++t)
        for (int r = 0; r < 2 * k2; ++r) {
            Bf16 v{0};
            if (r < rank) from_f(s[static_cast<int64_t>(t) * max_rank + r], &v);
            s16[static_cast<size_t>(t) * 2 * k2 + r] = v.v;
        }
    panels.resize(static_cast<size_t>(np) * pe);
    // Panel p, pair kk: lane j holds B[2kk][16p + j] (low half) and B[2kk + 1][16p + j] (high half).
    for (int p = 0; p < np; ++p)
        for (int kk = 0; kk < k2; ++kk) {
            const uint16_t* r0 = b + static_cast<int64_t>(2 * kk) * b_stride + p * lp_pair::kPanel;
            __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0)));
            if (2 * kk + 1 < rank)
                v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                             reinterpret_cast<const __m256i*>(r0 + b_stride))),
                                                         16));
            _mm512_storeu_si512(panels.data() + p * pe + static_cast<int64_t>(kk) * lp_pair::kPairElems, v);
        }
    const uint16_t* sx = s16.data();
    int r = 0;
    for (; r + 8 <= m; r += 8) expand_rows_dp_r<8>(sx + r * 2 * k2, k2, panels.data(), pe, np, y + r * ys, ys, scale);
    for (; r + 4 <= m; r += 4) expand_rows_dp_r<4>(sx + r * 2 * k2, k2, panels.data(), pe, np, y + r * ys, ys, scale);
    for (; r < m; ++r) expand_rows_dp_r<1>(sx + r * 2 * k2, k2, panels.data(), pe, np, y + r * ys, ys, scale);
}
#endif

template <typename TX, typename TW>
void shrink(const TX* x, int64_t x_stride, const TW* a, float* out, int num_tokens, int hidden, int num_slices,
            int num_slots, int max_rank, const int32_t* ranks, const int32_t* group_slot,
            const int32_t* group_start, int num_groups, const int32_t* token_idx, int num_threads, int dp_min) {
    // Slice-major: the slots' A rows of one slice are one contiguous region, read in slot order
    // (groups are sorted by slot), so the items of a call stream it front to back.
    std::vector<Item> items;
    for (int s = 0; s < num_slices; ++s)
        for (int g = 0; g < num_groups; ++g) {
            const int slot = group_slot[g];
            if (slot < 0 || slot >= num_slots || ranks[slot] <= 0) continue;
            const int n = group_start[g + 1] - group_start[g];
            for (int tile = 0; tile * kTokenTile < n; ++tile) items.push_back({g, tile, s});
        }
    const int n_items = static_cast<int>(items.size());
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (n_items > 1 && num_threads > 1)
    for (int it = 0; it < n_items; ++it) {
        const Item& item = items[it];
        const int slot = group_slot[item.group];
        const int rank = std::min(ranks[slot], max_rank);
        const int t0 = group_start[item.group] + item.tile * kTokenTile;
        const int t1 = std::min(t0 + kTokenTile, group_start[item.group + 1]);
        const TW* a_slot = a + (static_cast<int64_t>(item.part) * num_slots + slot) * max_rank * hidden;
        float* out_slice = out + static_cast<int64_t>(item.part) * num_tokens * max_rank;
        // The item after this one in the list (what this thread most likely runs next): its rows
        // are prefetched during the last token block's passes.
        const TW* a_next = nullptr;
        if (it + 1 < n_items) {
            const Item& nx = items[it + 1];
            a_next = a + (static_cast<int64_t>(nx.part) * num_slots + group_slot[nx.group]) * max_rank * hidden;
        }
#if defined(LP_DP_BF16)
        if constexpr (std::is_same_v<TX, Bf16> && std::is_same_v<TW, Bf16>) {
            if (dp_min > 0 && group_start[item.group + 1] - group_start[item.group] >= dp_min && hidden % 2 == 0 &&
                consecutive(token_idx, t0, t1)) {
                shrink_rows_dp(reinterpret_cast<const uint16_t*>(x + token_idx[t0] * x_stride), x_stride, t1 - t0,
                               reinterpret_cast<const uint16_t*>(a_slot), rank, hidden,
                               out_slice + static_cast<int64_t>(token_idx[t0]) * max_rank, max_rank);
                continue;
            }
        }
#endif
        for (int tb = t0; tb < t1; tb += kTokenBlock) {
            const int nb = std::min(kTokenBlock, t1 - tb);
            const TX* xr[kTokenBlock];
            float* o[kTokenBlock];
            for (int j = 0; j < nb; ++j) {
                const int64_t tok = token_idx[tb + j];
                xr[j] = x + tok * x_stride;
                o[j] = out_slice + tok * max_rank;
            }
            // Prefetch in the first token block (the rows come from memory) and the last (the
            // next item's rows); the blocks between re-read rows already in cache.
            const bool last = tb + kTokenBlock >= t1;
            const TW* nx = last ? a_next : nullptr;
            if (tb == t0 || last) {
                switch (nb) {
                    case 4: shrink_block<4, true>(xr, a_slot, rank, hidden, o, nx); break;
                    case 3: shrink_block<3, true>(xr, a_slot, rank, hidden, o, nx); break;
                    case 2: shrink_block<2, true>(xr, a_slot, rank, hidden, o, nx); break;
                    default: shrink_block<1, true>(xr, a_slot, rank, hidden, o, nx); break;
                }
            } else {
                shrink_block<4, false>(xr, a_slot, rank, hidden, o, nx);  // a middle block is full
            }
        }
    }
}

// One pass of rows r, r+1 of B over one column chunk: acc[j][0..w) += s[j][r] * b0 + s[j][r+1] * b1
// for NB tokens (each B row segment loaded once for all of them; half the accumulator loads and
// stores of one row at a time). p0 / p1: the rows to prefetch at the same columns.
// The arithmetic of a (token, column) element is the same whatever NB and whichever expand path
// calls it (batch invariance).
template <int NB, bool PF, typename TW>
inline void expand_pass(const float* s0v, const float* s1v, const TW* b0, const TW* b1, int w, float* acc,
                        const TW* p0, const TW* p1) {
#if LP_SGMV_AVX512
    const int wv = w & ~15;
    __m512 s0[NB], s1[NB];
    for (int j = 0; j < NB; ++j) {
        s0[j] = _mm512_set1_ps(s0v[j]);
        s1[j] = _mm512_set1_ps(s1v[j]);
    }
    for (int i = 0; i < wv; i += 16) {
        if (PF) {
            prefetch_line(p0, i);
            prefetch_line(p1, i);
        }
        const __m512 v0 = vload(b0 + i), v1 = vload(b1 + i);
        for (int j = 0; j < NB; ++j) {
            float* aj = acc + j * kExpandCols + i;
            _mm512_storeu_ps(aj, _mm512_fmadd_ps(s1[j], v1, _mm512_fmadd_ps(s0[j], v0, _mm512_loadu_ps(aj))));
        }
    }
    for (int i = wv; i < w; ++i)
        for (int j = 0; j < NB; ++j) acc[j * kExpandCols + i] += s0v[j] * to_f(b0[i]) + s1v[j] * to_f(b1[i]);
#else
    (void)s0v, (void)s1v, (void)b0, (void)b1, (void)w, (void)acc, (void)p0, (void)p1;
#endif
}

// One row of B (the odd last row, or every row on the portable build): acc[j] += s[j][r] * b.
template <int NB, typename TW>
inline void expand_row(const float* sv, const TW* br, int w, float* acc) {
    for (int j = 0; j < NB; ++j) {
        const float s = sv[j];
        float* aj = acc + j * kExpandCols;
#pragma omp simd
        for (int i = 0; i < w; ++i) aj[i] += s * to_f(br[i]);
    }
}

// One work item of expand: tokens st[0..NB) (their shrunk rows, per chunk's slice) over column
// chunks [k0, k1) of B. The rows are streamed in order across all the chunks (a row of one
// slot is contiguous: a single memory stream per row when the chunks are the slot's whole width),
// each chunk's fp32 accumulators (NB x kExpandCols, acc + (k - k0) * kTokenBlock * kExpandCols)
// updated per row pair; then y += scale * acc, once per element.
template <int NB, bool PF, typename TY, typename TW>
inline void expand_item(const float* const* st, int64_t slice_stride, const TW* b_slot, int64_t b_stride, int rank,
                        const int* chunk_lo, const int* chunk_w, const int* chunk_slice, int k0, int k1, float* acc,
                        const TW* next, TY* const* yr, float scale) {
    const int nk = k1 - k0;
    for (int k = 0; k < nk; ++k)
        for (int j = 0; j < NB; ++j) {
            float* a = acc + (static_cast<int64_t>(k) * kTokenBlock + j) * kExpandCols;
            std::fill(a, a + chunk_w[k0 + k], 0.f);
        }
    float sv0[NB], sv1[NB];
    int r = 0;
#if LP_SGMV_AVX512
    for (; r + 2 <= rank; r += 2) {
        const TW* b0 = b_slot + static_cast<int64_t>(r) * b_stride;
        const TW* b1 = b0 + b_stride;
        const TW* p0 = row_or_next(b_slot, next, b_stride, rank, r + kPrefetchRows);
        const TW* p1 = row_or_next(b_slot, next, b_stride, rank, r + 1 + kPrefetchRows);
        for (int k = 0; k < nk; ++k) {
            const int c = chunk_lo[k0 + k] - chunk_lo[k0], sl = chunk_slice[k0 + k];
            for (int j = 0; j < NB; ++j) {
                sv0[j] = st[j][sl * slice_stride + r];
                sv1[j] = st[j][sl * slice_stride + r + 1];
            }
            expand_pass<NB, PF>(sv0, sv1, b0 + c, b1 + c, chunk_w[k0 + k],
                            acc + static_cast<int64_t>(k) * kTokenBlock * kExpandCols, p0 + c, p1 + c);
        }
    }
#else
    (void)next;
    (void)sv1;
#endif
    for (; r < rank; ++r) {
        const TW* br = b_slot + static_cast<int64_t>(r) * b_stride;
        for (int k = 0; k < nk; ++k) {
            const int c = chunk_lo[k0 + k] - chunk_lo[k0], sl = chunk_slice[k0 + k];
            for (int j = 0; j < NB; ++j) sv0[j] = st[j][sl * slice_stride + r];
            expand_row<NB>(sv0, br + c, chunk_w[k0 + k], acc + static_cast<int64_t>(k) * kTokenBlock * kExpandCols);
        }
    }
    for (int k = 0; k < nk; ++k) {
        const int c = chunk_lo[k0 + k] - chunk_lo[k0], w = chunk_w[k0 + k];
        for (int j = 0; j < NB; ++j) {
            TY* y = yr[j] + c;
            const float* aj = acc + (static_cast<int64_t>(k) * kTokenBlock + j) * kExpandCols;
#pragma omp simd
            for (int i = 0; i < w; ++i) from_f(to_f(y[i]) + scale * aj[i], y + i);
        }
    }
}

// Column chunks per work item when a group is one token block (decode: one token per adapter):
// the chunks of a slot's whole width (all slices) in one item stream each B row once, end to end,
// instead of one short strided segment per item (k/v: 192 columns). Accumulators: kSweepChunks x
// kTokenBlock x kExpandCols fp32 per thread.
constexpr int kSweepChunks = 4;  // measured: 1 (the previous kernel's items) 0.65-0.74x of old, 4 or 8 0.53-0.66x

template <typename TY, typename TW>
void expand(TY* y, int64_t y_stride, const float* shrunk, const TW* b, int num_tokens, int total_out,
            int num_slots, int max_rank, const int32_t* ranks, const float* scales, const int32_t* offsets,
            int num_slices, const int32_t* group_slot, const int32_t* group_start, int num_groups,
            const int32_t* token_idx, int num_threads, int dp_min) {
    // Column chunks never straddle a slice boundary: each reads one slice's shrunk activations.
    std::vector<int> chunk_lo, chunk_w, chunk_slice;
    for (int s = 0; s < num_slices; ++s)
        for (int c = offsets[s]; c < offsets[s + 1]; c += kExpandCols) {
            chunk_lo.push_back(c);
            chunk_w.push_back(std::min(kExpandCols, offsets[s + 1] - c));
            chunk_slice.push_back(s);
        }
    const int n_chunks = static_cast<int>(chunk_lo.size());
    // Item: (group, token tile, chunks [k0, k1)). A group of at most
    // one token block sweeps up to kSweepChunks chunks per item; a longer group (prefill) one chunk
    // per item, its tokens in tiles (parallelism).
    struct EItem {
        int group, tile, k0, k1;
    };
    std::vector<EItem> items;
    for (int g = 0; g < num_groups; ++g) {
        const int slot = group_slot[g];
        if (slot < 0 || slot >= num_slots || ranks[slot] <= 0) continue;
        const int n = group_start[g + 1] - group_start[g];
        const int step = n <= kTokenBlock ? kSweepChunks : 1;
        for (int tile = 0; tile * kTokenTile < n; ++tile)
            for (int c = 0; c < n_chunks; c += step) items.push_back({g, tile, c, std::min(c + step, n_chunks)});
    }
    const int n_items = static_cast<int>(items.size());
    const int64_t slice_stride = static_cast<int64_t>(num_tokens) * max_rank;
    int max_chunks = 1;
    for (const EItem& item : items) max_chunks = std::max(max_chunks, item.k1 - item.k0);
    const size_t acc_size = static_cast<size_t>(max_chunks) * kTokenBlock * kExpandCols;
    // Items write disjoint (token, column) regions of y: tokens of different groups are distinct
    // and chunks of one group are distinct columns.
#pragma omp parallel num_threads(num_threads) if (n_items > 1 && num_threads > 1)
    {
        // Per thread, uninitialised (expand_item zeroes what it uses): as large as the widest item.
        std::unique_ptr<float[]> acc_buf(new float[acc_size]);
        float* acc = acc_buf.get();
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; ++it) {
            const EItem& item = items[it];
            const int slot = group_slot[item.group];
            const int rank = std::min(ranks[slot], max_rank);
            const float scale = scales[slot];
            const int c0 = chunk_lo[item.k0];
            const TW* b_slot = b + static_cast<int64_t>(slot) * max_rank * total_out + c0;
            const TW* b_next = nullptr;
            if (it + 1 < n_items) {
                const EItem& nx = items[it + 1];
                b_next = b + static_cast<int64_t>(group_slot[nx.group]) * max_rank * total_out + chunk_lo[nx.k0];
            }
            const int t0 = group_start[item.group] + item.tile * kTokenTile;
            const int t1 = std::min(t0 + kTokenTile, group_start[item.group + 1]);
#if defined(LP_DP_BF16)
            if constexpr (std::is_same_v<TY, Bf16> && std::is_same_v<TW, Bf16>) {
                const int w = chunk_w[item.k0];
                if (dp_min > 0 && group_start[item.group + 1] - group_start[item.group] >= dp_min &&
                    item.k1 - item.k0 == 1 && w % lp_pair::kPanel == 0 && consecutive(token_idx, t0, t1)) {
                    const int64_t tok = token_idx[t0];
                    expand_rows_dp(reinterpret_cast<uint16_t*>(y + tok * y_stride + c0), y_stride,
                                   shrunk + chunk_slice[item.k0] * slice_stride + tok * max_rank, max_rank, t1 - t0,
                                   reinterpret_cast<const uint16_t*>(b_slot), total_out, rank, w, scale);
                    continue;
                }
            }
#endif
            for (int tb = t0; tb < t1; tb += kTokenBlock) {
                const int nb = std::min(kTokenBlock, t1 - tb);
                const float* st[kTokenBlock];
                TY* yr[kTokenBlock];
                for (int j = 0; j < nb; ++j) {
                    const int64_t tok = token_idx[tb + j];
                    st[j] = shrunk + tok * max_rank;
                    yr[j] = y + tok * y_stride + c0;
                }
                // Prefetch in the first token block and the last (as in shrink).
                const bool last = tb + kTokenBlock >= t1;
                const TW* nx = last ? b_next : nullptr;
                const int* cl = chunk_lo.data();
                const int* cw = chunk_w.data();
                const int* cs = chunk_slice.data();
                const int k0 = item.k0, k1 = item.k1;
                if (tb == t0 || last) {
                    switch (nb) {
                        case 4: expand_item<4, true>(st, slice_stride, b_slot, total_out, rank, cl, cw, cs, k0, k1, acc, nx, yr, scale); break;
                        case 3: expand_item<3, true>(st, slice_stride, b_slot, total_out, rank, cl, cw, cs, k0, k1, acc, nx, yr, scale); break;
                        case 2: expand_item<2, true>(st, slice_stride, b_slot, total_out, rank, cl, cw, cs, k0, k1, acc, nx, yr, scale); break;
                        default: expand_item<1, true>(st, slice_stride, b_slot, total_out, rank, cl, cw, cs, k0, k1, acc, nx, yr, scale); break;
                    }
                } else {
                    expand_item<4, false>(st, slice_stride, b_slot, total_out, rank, cl, cw, cs, k0, k1, acc, nx, yr, scale);
                }
            }
        }
    }
}

}  // namespace

// Entry points: lp_sgmv_{shrink,expand}_<activation>_<weight storage>.
#define LP_SHRINK(NAME, TX, TW)                                                                               \
    void NAME(const TX* x, int64_t xs, const TW* a, float* out, int nt, int h, int ns, int nl, int mr,          \
              const int32_t* ranks, const int32_t* gs, const int32_t* gst, int ng, const int32_t* ti, int th) { \
        shrink<TX, TW>(x, xs, a, out, nt, h, ns, nl, mr, ranks, gs, gst, ng, ti, th, 0);                        \
    }
#define LP_EXPAND(NAME, TY, TW)                                                                               \
    void NAME(TY* y, int64_t ys, const float* sh, const TW* b, int nt, int to, int nl, int mr,                  \
              const int32_t* ranks, const float* scales, const int32_t* offs, int ns, const int32_t* gs,         \
              const int32_t* gst, int ng, const int32_t* ti, int th) {                                          \
        expand<TY, TW>(y, ys, sh, b, nt, to, nl, mr, ranks, scales, offs, ns, gs, gst, ng, ti, th, 0);          \
    }

extern "C" {

LP_SHRINK(lp_sgmv_shrink_f32_f32, float, float)
LP_SHRINK(lp_sgmv_shrink_f32_f16, float, F16)
LP_SHRINK(lp_sgmv_shrink_f32_bf16, float, Bf16)
LP_SHRINK(lp_sgmv_shrink_bf16_bf16, Bf16, Bf16)
LP_SHRINK(lp_sgmv_shrink_bf16_f16, Bf16, F16)
LP_SHRINK(lp_sgmv_shrink_bf16_f32, Bf16, float)
LP_EXPAND(lp_sgmv_expand_f32_f32, float, float)
LP_EXPAND(lp_sgmv_expand_f32_f16, float, F16)
LP_EXPAND(lp_sgmv_expand_f32_bf16, float, Bf16)
LP_EXPAND(lp_sgmv_expand_bf16_bf16, Bf16, Bf16)
LP_EXPAND(lp_sgmv_expand_bf16_f16, Bf16, F16)
LP_EXPAND(lp_sgmv_expand_bf16_f32, Bf16, float)

// bf16 activations and weights with prompt-sized groups (>= dp_min consecutive tokens of one
// adapter) on the vdpbf16ps tiles where the build has AVX512-BF16; lp_sgmv_prompt_groups() says so.
void lp_sgmv_shrink_bf16_bf16_groups(const Bf16* x, int64_t xs, const Bf16* a, float* out, int nt, int h, int ns,
                                     int nl, int mr, const int32_t* ranks, const int32_t* gs, const int32_t* gst,
                                     int ng, const int32_t* ti, int th, int dp_min) {
    shrink<Bf16, Bf16>(x, xs, a, out, nt, h, ns, nl, mr, ranks, gs, gst, ng, ti, th, dp_min);
}
void lp_sgmv_expand_bf16_bf16_groups(Bf16* y, int64_t ys, const float* sh, const Bf16* b, int nt, int to, int nl,
                                     int mr, const int32_t* ranks, const float* scales, const int32_t* offs, int ns,
                                     const int32_t* gs, const int32_t* gst, int ng, const int32_t* ti, int th,
                                     int dp_min) {
    expand<Bf16, Bf16>(y, ys, sh, b, nt, to, nl, mr, ranks, scales, offs, ns, gs, gst, ng, ti, th, dp_min);
}
int lp_sgmv_prompt_groups(void) {
#if defined(LP_DP_BF16)
    return 1;
#else
    return 0;
#endif
}

// 1 when float16 weights convert in vector registers (AVX-512F: vcvtph2ps), i.e. float16 storage
// costs no more compute than float32; 0 on the portable fallback.
int lp_sgmv_fast_f16(void) {
#if LP_SGMV_AVX512
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"
