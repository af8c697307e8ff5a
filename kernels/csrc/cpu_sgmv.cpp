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
#include <vector>
#include <omp.h>
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
#ifndef LP_PREFETCH
#define LP_PREFETCH 1024  // bytes ahead of the A stream (measured: benchmarks/kernels/cpu_sgmv.py)
#endif

struct Item {
    int group, tile, part;  // part: slice (shrink) or column chunk (expand)
};

// out[j][r] = x_j . a_r for r < rank, NB tokens at once (each A row loaded once for all of them).
// Two A rows per pass: 2 x NB independent FMA chains and two streams in flight.
template <int NB, typename TX, typename TW>
inline void shrink_block(const TX* const* xr, const TW* a, int rank, int hidden, float* const* out) {
    int r = 0;
#if LP_SGMV_AVX512
    for (; r + 2 <= rank; r += 2) {
        const TW* a0 = a + static_cast<int64_t>(r) * hidden;
        const TW* a1 = a0 + hidden;
        __m512 acc0[NB], acc1[NB];
        for (int j = 0; j < NB; ++j) acc0[j] = acc1[j] = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= hidden; i += 16) {
            // The slot's rows are contiguous: keep lines in flight well ahead of use.
            _mm_prefetch(reinterpret_cast<const char*>(a1 + i) + LP_PREFETCH, _MM_HINT_T0);
            const __m512 w0 = vload(a0 + i), w1 = vload(a1 + i);
            for (int j = 0; j < NB; ++j) {
                const __m512 xv = vload(xr[j] + i);
                acc0[j] = _mm512_fmadd_ps(w0, xv, acc0[j]);
                acc1[j] = _mm512_fmadd_ps(w1, xv, acc1[j]);
            }
        }
        if (i < hidden) {
            const __m512 w0 = vload_tail(a0 + i, hidden - i), w1 = vload_tail(a1 + i, hidden - i);
            for (int j = 0; j < NB; ++j) {
                const __m512 xv = vload_tail(xr[j] + i, hidden - i);
                acc0[j] = _mm512_fmadd_ps(w0, xv, acc0[j]);
                acc1[j] = _mm512_fmadd_ps(w1, xv, acc1[j]);
            }
        }
        for (int j = 0; j < NB; ++j) {
            out[j][r] = _mm512_reduce_add_ps(acc0[j]);
            out[j][r + 1] = _mm512_reduce_add_ps(acc1[j]);
        }
    }
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

template <typename TX, typename TW>
void shrink(const TX* x, int64_t x_stride, const TW* a, float* out, int num_tokens, int hidden, int num_slices,
            int num_slots, int max_rank, const int32_t* ranks, const int32_t* group_slot,
            const int32_t* group_start, int num_groups, const int32_t* token_idx, int num_threads) {
    std::vector<Item> items;
    for (int g = 0; g < num_groups; ++g) {
        const int slot = group_slot[g];
        if (slot < 0 || slot >= num_slots || ranks[slot] <= 0) continue;
        const int n = group_start[g + 1] - group_start[g];
        for (int tile = 0; tile * kTokenTile < n; ++tile)
            for (int s = 0; s < num_slices; ++s) items.push_back({g, tile, s});
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
        for (int tb = t0; tb < t1; tb += kTokenBlock) {
            const int nb = std::min(kTokenBlock, t1 - tb);
            const TX* xr[kTokenBlock];
            float* o[kTokenBlock];
            for (int j = 0; j < nb; ++j) {
                const int64_t tok = token_idx[tb + j];
                xr[j] = x + tok * x_stride;
                o[j] = out_slice + tok * max_rank;
            }
            switch (nb) {
                case 4: shrink_block<4>(xr, a_slot, rank, hidden, o); break;
                case 3: shrink_block<3>(xr, a_slot, rank, hidden, o); break;
                case 2: shrink_block<2>(xr, a_slot, rank, hidden, o); break;
                default: shrink_block<1>(xr, a_slot, rank, hidden, o); break;
            }
        }
    }
}

// acc[j][0..w) = sum_r s[j][r] * b[r][0..w) for NB tokens, streaming each B row segment once
// (two rows per pass: half the accumulator loads and stores).
template <int NB, typename TW>
inline void expand_block(const float* const* s, const TW* b, int64_t b_stride, int rank, int w, float* acc) {
    for (int j = 0; j < NB; ++j) std::fill(acc + j * kExpandCols, acc + j * kExpandCols + w, 0.f);
    int r = 0;
#if LP_SGMV_AVX512
    const int wv = w & ~15;
    for (; r + 2 <= rank; r += 2) {
        const TW* b0 = b + static_cast<int64_t>(r) * b_stride;
        const TW* b1 = b0 + b_stride;
        __m512 s0[NB], s1[NB];
        for (int j = 0; j < NB; ++j) {
            s0[j] = _mm512_set1_ps(s[j][r]);
            s1[j] = _mm512_set1_ps(s[j][r + 1]);
        }
        for (int i = 0; i < wv; i += 16) {
            _mm_prefetch(reinterpret_cast<const char*>(b1 + b_stride + i), _MM_HINT_T0);  // rows r+2, r+3
            _mm_prefetch(reinterpret_cast<const char*>(b1 + 2 * b_stride + i), _MM_HINT_T0);
            const __m512 v0 = vload(b0 + i), v1 = vload(b1 + i);
            for (int j = 0; j < NB; ++j) {
                float* aj = acc + j * kExpandCols + i;
                _mm512_storeu_ps(aj, _mm512_fmadd_ps(s1[j], v1, _mm512_fmadd_ps(s0[j], v0, _mm512_loadu_ps(aj))));
            }
        }
        for (int i = wv; i < w; ++i)
            for (int j = 0; j < NB; ++j) acc[j * kExpandCols + i] += s[j][r] * to_f(b0[i]) + s[j][r + 1] * to_f(b1[i]);
    }
#endif
    for (; r < rank; ++r) {
        const TW* br = b + static_cast<int64_t>(r) * b_stride;
        for (int j = 0; j < NB; ++j) {
            const float sv = s[j][r];
            float* aj = acc + j * kExpandCols;
#pragma omp simd
            for (int i = 0; i < w; ++i) aj[i] += sv * to_f(br[i]);
        }
    }
}

template <typename TY, typename TW>
void expand(TY* y, int64_t y_stride, const float* shrunk, const TW* b, int num_tokens, int total_out,
            int num_slots, int max_rank, const int32_t* ranks, const float* scales, const int32_t* offsets,
            int num_slices, const int32_t* group_slot, const int32_t* group_start, int num_groups,
            const int32_t* token_idx, int num_threads) {
    // Column chunks never straddle a slice boundary: each reads one slice's shrunk activations.
    std::vector<int> chunk_lo, chunk_slice;
    for (int s = 0; s < num_slices; ++s)
        for (int c = offsets[s]; c < offsets[s + 1]; c += kExpandCols) {
            chunk_lo.push_back(c);
            chunk_slice.push_back(s);
        }
    const int n_chunks = static_cast<int>(chunk_lo.size());
    std::vector<Item> items;
    for (int g = 0; g < num_groups; ++g) {
        const int slot = group_slot[g];
        if (slot < 0 || slot >= num_slots || ranks[slot] <= 0) continue;
        const int n = group_start[g + 1] - group_start[g];
        for (int tile = 0; tile * kTokenTile < n; ++tile)
            for (int c = 0; c < n_chunks; ++c) items.push_back({g, tile, c});
    }
    const int n_items = static_cast<int>(items.size());
    // Items write disjoint (token, column) regions of y: tokens of different groups are distinct
    // and chunks of one group are distinct columns.
#pragma omp parallel num_threads(num_threads) if (n_items > 1 && num_threads > 1)
    {
        std::vector<float> acc_buf(static_cast<size_t>(kTokenBlock) * kExpandCols);
        float* acc = acc_buf.data();
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; ++it) {
            const Item& item = items[it];
            const int slot = group_slot[item.group];
            const int rank = std::min(ranks[slot], max_rank);
            const float scale = scales[slot];
            const int s = chunk_slice[item.part];
            const int c0 = chunk_lo[item.part];
            const int w = std::min(kExpandCols, offsets[s + 1] - c0);
            const TW* b_slot = b + static_cast<int64_t>(slot) * max_rank * total_out + c0;
            const float* sh = shrunk + static_cast<int64_t>(s) * num_tokens * max_rank;
            const int t0 = group_start[item.group] + item.tile * kTokenTile;
            const int t1 = std::min(t0 + kTokenTile, group_start[item.group + 1]);
            for (int tb = t0; tb < t1; tb += kTokenBlock) {
                const int nb = std::min(kTokenBlock, t1 - tb);
                const float* st[kTokenBlock];
                for (int j = 0; j < nb; ++j) st[j] = sh + static_cast<int64_t>(token_idx[tb + j]) * max_rank;
                switch (nb) {
                    case 4: expand_block<4>(st, b_slot, total_out, rank, w, acc); break;
                    case 3: expand_block<3>(st, b_slot, total_out, rank, w, acc); break;
                    case 2: expand_block<2>(st, b_slot, total_out, rank, w, acc); break;
                    default: expand_block<1>(st, b_slot, total_out, rank, w, acc); break;
                }
                for (int j = 0; j < nb; ++j) {
                    TY* yr = y + static_cast<int64_t>(token_idx[tb + j]) * y_stride + c0;
                    const float* aj = acc + j * kExpandCols;
#pragma omp simd
                    for (int i = 0; i < w; ++i) from_f(to_f(yr[i]) + scale * aj[i], yr + i);
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
        shrink<TX, TW>(x, xs, a, out, nt, h, ns, nl, mr, ranks, gs, gst, ng, ti, th);                           \
    }
#define LP_EXPAND(NAME, TY, TW)                                                                               \
    void NAME(TY* y, int64_t ys, const float* sh, const TW* b, int nt, int to, int nl, int mr,                  \
              const int32_t* ranks, const float* scales, const int32_t* offs, int ns, const int32_t* gs,         \
              const int32_t* gst, int ng, const int32_t* ti, int th) {                                          \
        expand<TY, TW>(y, ys, sh, b, nt, to, nl, mr, ranks, scales, offs, ns, gs, gst, ng, ti, th);             \
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
