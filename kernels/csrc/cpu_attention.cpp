// Paged attention for CPU serving: reads K/V straight out of the paged cache (no gather copy),
// one call per layer for a whole batch, OpenMP over (query row, KV head).
//
// Built by kernels/cpu_native.py with the system C++ compiler into a per-machine cache and called
// through ctypes, so it needs no torch headers (a ~1 s compile). It links the libgomp torch already
// loaded (same soname), so its threads are torch's threads.
//
// Layouts (match kernels/reference.py):
//   q, out:        [num_rows, hq, d]                      (rows = decode sequences or prefill tokens)
//   k/v cache:     [num_blocks, block_size, hkv, d]
//   block_tables:  int32 [num_seqs, table_width]
//   row_seq:       int32 [num_rows]  which sequence (block-table row) a query row belongs to
//   row_len:       int32 [num_rows]  how many KV positions the row sees (causal: its position + 1)
// Scores are accumulated in fp32 whatever the storage type (fp32 or bf16).
// Decode tiles (one query row) take an AVX-512 tile where the build has AVX-512 (decode_row_fast:
// online softmax, one pass over K and V) unless the caller passes decode_tile = 0; prefill tiles
// and other CPUs the portable attend(). The two round differently (fp32 order), so a caller that
// needs a position's result to be the same whether it was decoded or recomputed in a prefill chunk
// (the batch-invariant mode: preemption recomputes decoded positions) turns the decode tile off.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "simd_exp.h"

using lp_bf16::bf2f;
using lp_bf16::f2bf;

namespace {

inline float to_f(float x) { return x; }
inline float to_f(uint16_t x) { return bf2f(x); }
inline void from_f(float x, float* dst) { *dst = x; }
inline void from_f(float x, uint16_t* dst) { *dst = f2bf(x); }

constexpr int kTile = 4;        // consecutive prefill rows of one sequence that share each K/V load

struct Scratch {
    std::vector<float> q, acc, s, kv;
};

// The next block of a sequence is anywhere in the pool: start fetching it while this one is used.
template <typename T>
inline void prefetch_rows(const T* cache, const int32_t* table, int next_block, int n_blocks, int block_size,
                          int64_t tok_stride, int tt) {
    if (next_block >= n_blocks) return;
    const char* row = reinterpret_cast<const char*>(
        cache + (static_cast<int64_t>(table[next_block]) * block_size + tt) * tok_stride);
    const int64_t bytes = tok_stride * static_cast<int64_t>(sizeof(T));
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 1);
}

// One tile: `m_rows` query vectors (nt consecutive rows x the `group` heads of KV head h), row m
// seeing the first len[m] cached positions. Two passes (scores, then softmax-weighted V) walking the
// block table directly.
template <typename T>
void attend(const T* const* qp, T* const* op, const int* len, const int* head_off, int m_rows, const T* k_cache,
            const T* v_cache, const int32_t* table, int token_stride, int d, int block_size, float scale,
            Scratch& w) {
    int max_len = 0;
    for (int m = 0; m < m_rows; ++m) max_len = std::max(max_len, len[m]);
    w.q.resize(static_cast<size_t>(m_rows) * d);
    w.acc.assign(static_cast<size_t>(m_rows) * d, 0.f);
    w.s.resize(static_cast<size_t>(m_rows) * std::max(max_len, 1));
    w.kv.resize(token_stride);
    float* qf = w.q.data();
    float* acc = w.acc.data();
    float* s = w.s.data();
    float* kf = w.kv.data();
    for (int m = 0; m < m_rows; ++m)
        for (int i = 0; i < d; ++i) qf[m * d + i] = to_f(qp[m][i]) * scale;
    const int64_t tok_stride = token_stride;
    const int n_blocks = (max_len + block_size - 1) / block_size;
    for (int b = 0; b < n_blocks; ++b) {
        const int64_t slot0 = static_cast<int64_t>(table[b]) * block_size;
        const int tn = std::min(block_size, max_len - b * block_size);
        for (int tt = 0; tt < tn; ++tt) {
            prefetch_rows(k_cache, table, b + 1, n_blocks, block_size, tok_stride, tt);
            const int t = b * block_size + tt;
            // The whole token row (every KV head) is contiguous: read it once, in order.
            const T* kr = k_cache + (slot0 + tt) * tok_stride;
            const float* krow;
            if constexpr (sizeof(T) == 4) {
                krow = reinterpret_cast<const float*>(kr);
            } else {
                for (int i = 0; i < token_stride; ++i) kf[i] = to_f(kr[i]);
                krow = kf;
            }
            for (int m = 0; m < m_rows; ++m) {
                if (t >= len[m]) continue;
                const float* qm = qf + m * d;
                const float* kv = krow + head_off[m];
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < d; ++i) dot += qm[i] * kv[i];
                s[m * max_len + t] = dot;
            }
        }
    }
    for (int m = 0; m < m_rows; ++m) {
        float* sm = s + m * max_len;
        float mx = -INFINITY, sum = 0.f;
        for (int t = 0; t < len[m]; ++t) mx = std::max(mx, sm[t]);
        for (int t = 0; t < len[m]; ++t) { sm[t] = std::exp(sm[t] - mx); sum += sm[t]; }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int t = 0; t < len[m]; ++t) sm[t] *= inv;
    }
    for (int b = 0; b < n_blocks; ++b) {
        const int64_t slot0 = static_cast<int64_t>(table[b]) * block_size;
        const int tn = std::min(block_size, max_len - b * block_size);
        for (int tt = 0; tt < tn; ++tt) {
            prefetch_rows(v_cache, table, b + 1, n_blocks, block_size, tok_stride, tt);
            const int t = b * block_size + tt;
            const T* vr = v_cache + (slot0 + tt) * tok_stride;
            const float* vrow;
            if constexpr (sizeof(T) == 4) {
                vrow = reinterpret_cast<const float*>(vr);
            } else {
                for (int i = 0; i < token_stride; ++i) kf[i] = to_f(vr[i]);
                vrow = kf;
            }
            for (int m = 0; m < m_rows; ++m) {
                if (t >= len[m]) continue;
                const float p = s[m * max_len + t];
                const float* vv = vrow + head_off[m];
                float* am = acc + m * d;
#pragma omp simd
                for (int i = 0; i < d; ++i) am[i] += p * vv[i];
            }
        }
    }
    for (int m = 0; m < m_rows; ++m)
        for (int i = 0; i < d; ++i) from_f(acc[m * d + i], op[m] + i);
}

#if defined(__AVX512F__)
// ---------------------------------------------------------------------------------------------
// AVX-512 decode tile: ONE query row (all hq heads of one sequence), head dim d = 16 * NV.
// Per KV head: the group's scaled queries stay in registers; each cached K/V head slice is widened
// to fp32 once and used by every query head of the group. Scores of up to 16 tokens are reduced
// together (a transpose-add tree instead of one horizontal sum per token and head), and the softmax
// is online (running max and sum per head, accumulator rescaled when the max grows), so each block's
// K and V are read once, back to back. Everything in fp32; only the summation order and the softmax
// normalization point differ from the portable path (fp32 rounding).

template <typename T>
inline __m512 load16(const T* p) {
    if constexpr (sizeof(T) == 4) {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// v[t] holds 16 partial sums of token t's score; returns the 16 scores (lane t = sum of v[t]).
inline __m512 sum16x16(__m512* v) {
    for (int j = 0; j < 8; ++j)  // 512-bit halves: token 2j in lanes 0-1, 2j+1 in lanes 2-3
        v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
    for (int j = 0; j < 4; ++j)  // 128-bit lane k of v[j] = token 4j + k (4 partials)
        v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; ++j)  // lane k: elements 0-1 token 8j + k, elements 2-3 token 8j + 4 + k
        v[j] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(v[2 * j], v[2 * j + 1], 0xEE));
    // lane k, element j: token k + 4j
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, r);
}

template <typename T, int NV, int G>
void decode_row_avx512(const T* q, T* out, int len, int hq, int hkv, const T* k_cache, const T* v_cache,
                       const int32_t* table, int block_size, float scale) {
    constexpr int d = 16 * NV;
    constexpr int group = G;  // a compile-time group: queries and accumulators stay in registers
    (void)hq;
    const int64_t tok_stride = static_cast<int64_t>(hkv) * d;
    const int n_blocks = (len + block_size - 1) / block_size;
    alignas(64) float pbuf[G][16];
    alignas(64) float obuf[d];
    __m512 parts[G][16];
    for (int h = 0; h < hkv; ++h) {
        __m512 qv[G][NV], acc[G][NV];
        float mx[G], sum[G];
        for (int g = 0; g < group; ++g) {
            const T* qh = q + static_cast<int64_t>(h * group + g) * d;
            for (int v = 0; v < NV; ++v) {
                qv[g][v] = _mm512_mul_ps(load16(qh + 16 * v), _mm512_set1_ps(scale));
                acc[g][v] = _mm512_setzero_ps();
            }
            for (int t = 0; t < 16; ++t) parts[g][t] = _mm512_setzero_ps();
            mx[g] = -INFINITY;
            sum[g] = 0.f;
        }
        const T* kh = k_cache + static_cast<int64_t>(h) * d;
        const T* vh = v_cache + static_cast<int64_t>(h) * d;
        for (int b = 0; b < n_blocks; ++b) {
            const int64_t slot0 = static_cast<int64_t>(table[b]) * block_size;
            const int tn = std::min(block_size, len - b * block_size);
            if (b + 1 < n_blocks) {  // the next block is anywhere in the pool: fetch it meanwhile
                const int64_t next = static_cast<int64_t>(table[b + 1]) * block_size;
                const int nn = std::min(block_size, len - (b + 1) * block_size);
                for (int tt = 0; tt < nn; ++tt) {
                    const char* kp = reinterpret_cast<const char*>(kh + (next + tt) * tok_stride);
                    const char* vp = reinterpret_cast<const char*>(vh + (next + tt) * tok_stride);
                    for (int off = 0; off < d * static_cast<int>(sizeof(T)); off += 64) {
                        __builtin_prefetch(kp + off, 0, 1);
                        __builtin_prefetch(vp + off, 0, 1);
                    }
                }
            }
            for (int c0 = 0; c0 < tn; c0 += 16) {
                const int cn = std::min(16, tn - c0);
                for (int tt = 0; tt < cn; ++tt) {
                    const T* kr = kh + (slot0 + c0 + tt) * tok_stride;
                    __m512 kv[NV];
                    for (int v = 0; v < NV; ++v) kv[v] = load16(kr + 16 * v);
                    for (int g = 0; g < group; ++g) {
                        __m512 p = _mm512_mul_ps(qv[g][0], kv[0]);
                        for (int v = 1; v < NV; ++v) p = _mm512_fmadd_ps(qv[g][v], kv[v], p);
                        parts[g][tt] = p;
                    }
                }
                const __mmask16 live = static_cast<__mmask16>((1u << cn) - 1u);
                for (int g = 0; g < group; ++g) {
                    // (lanes past cn hold stale sums: masked to -inf, so their p is 0)
                    const __m512 s = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), sum16x16(parts[g]));
                    const float m_new = std::max(mx[g], _mm512_reduce_max_ps(s));
                    const float ref = m_new == -INFINITY ? 0.f : m_new;  // all -inf so far: p = 0
                    const __m512 p = lp_simd::exp512(_mm512_sub_ps(s, _mm512_set1_ps(ref)));
                    _mm512_store_ps(pbuf[g], p);
                    if (m_new > mx[g]) {
                        const float alpha = mx[g] == -INFINITY ? 0.f : std::exp(mx[g] - ref);
                        const __m512 a = _mm512_set1_ps(alpha);
                        for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_mul_ps(acc[g][v], a);
                        sum[g] *= alpha;
                        mx[g] = m_new;
                    }
                    sum[g] += _mm512_reduce_add_ps(p);
                }
                for (int tt = 0; tt < cn; ++tt) {
                    const T* vr = vh + (slot0 + c0 + tt) * tok_stride;
                    __m512 vv[NV];
                    for (int v = 0; v < NV; ++v) vv[v] = load16(vr + 16 * v);
                    for (int g = 0; g < group; ++g) {
                        const __m512 p = _mm512_set1_ps(pbuf[g][tt]);
                        for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_fmadd_ps(p, vv[v], acc[g][v]);
                    }
                }
            }
        }
        for (int g = 0; g < group; ++g) {
            const __m512 inv = _mm512_set1_ps(sum[g] > 0.f ? 1.f / sum[g] : 0.f);
            T* oh = out + static_cast<int64_t>(h * group + g) * d;
            for (int v = 0; v < NV; ++v) _mm512_store_ps(obuf + 16 * v, _mm512_mul_ps(acc[g][v], inv));
            for (int i = 0; i < d; ++i) from_f(obuf[i], oh + i);
        }
    }
}

template <typename T, int NV>
bool decode_row_nv(const T* q, T* out, int len, int hq, int hkv, const T* k_cache, const T* v_cache,
                   const int32_t* table, int block_size, float scale) {
#define LP_GROUP(g)                                                                                   \
    case g:                                                                                           \
        decode_row_avx512<T, NV, g>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale); \
        return true;
    switch (hq / hkv) {
        LP_GROUP(1) LP_GROUP(2) LP_GROUP(3) LP_GROUP(4) LP_GROUP(5) LP_GROUP(6) LP_GROUP(7) LP_GROUP(8)
        default: return false;
    }
#undef LP_GROUP
}

// The AVX-512 decode tile when the shape allows it (d in {32, 64, 80, 96, 128}, GQA group 1..8);
// false: use the portable tile.
template <typename T>
bool decode_row_fast(const T* q, T* out, int len, int hq, int hkv, int d, const T* k_cache, const T* v_cache,
                     const int32_t* table, int block_size, float scale) {
    if (hkv <= 0 || hq % hkv != 0 || len <= 0) return false;
    switch (d) {
        case 32: return decode_row_nv<T, 2>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale);
        case 64: return decode_row_nv<T, 4>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale);
        case 80: return decode_row_nv<T, 5>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale);
        case 96: return decode_row_nv<T, 6>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale);
        case 128: return decode_row_nv<T, 8>(q, out, len, hq, hkv, k_cache, v_cache, table, block_size, scale);
        default: return false;
    }
}
#else
template <typename T>
bool decode_row_fast(const T*, T*, int, int, int, int, const T*, const T*, const int32_t*, int, float) {
    return false;
}
#endif

template <typename T>
void run(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables, int table_width,
         const int32_t* row_seq, const int32_t* row_len, T* out, int num_rows, int hq, int hkv, int d,
         int block_size, float scale, int num_threads, bool decode_tile) {
    const int group = hq / hkv;
    // Tiles of up to kTile consecutive rows of the same sequence (prefill chunks); decode rows are
    // one sequence each, so every decode tile is a single row.
    std::vector<int> tile_start;
    for (int r = 0; r < num_rows; ++r) {
        if (tile_start.empty() || row_seq[r] != row_seq[r - 1] || r - tile_start.back() >= kTile)
            tile_start.push_back(r);
    }
    const int n_tiles = static_cast<int>(tile_start.size());
    tile_start.push_back(num_rows);
    // One work item = one tile with ALL its heads, so each cached token row is read contiguously.
#pragma omp parallel num_threads(num_threads)
    {
        Scratch w;
        std::vector<const T*> qp;
        std::vector<T*> op;
        std::vector<int> len, head_off;
#pragma omp for schedule(dynamic, 1)
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int r0 = tile_start[tile], r1 = tile_start[tile + 1];
            // A sequence's only row this call (decode, or a 1-token chunk): the AVX-512 decode tile.
            // Rows of longer prefill chunks all keep attend(), whichever tile they fall in.
            const bool lone = r1 - r0 == 1 && (r0 == 0 || row_seq[r0 - 1] != row_seq[r0]) &&
                              (r1 == num_rows || row_seq[r1] != row_seq[r0]);
            if (decode_tile && lone &&
                decode_row_fast<T>(q + static_cast<int64_t>(r0) * hq * d, out + static_cast<int64_t>(r0) * hq * d,
                                   row_len[r0], hq, hkv, d, k_cache, v_cache,
                                   block_tables + static_cast<int64_t>(row_seq[r0]) * table_width, block_size, scale))
                continue;
            qp.clear(); op.clear(); len.clear(); head_off.clear();
            for (int r = r0; r < r1; ++r) {
                for (int hh = 0; hh < hq; ++hh) {
                    const int64_t off = (static_cast<int64_t>(r) * hq + hh) * d;
                    qp.push_back(q + off);
                    op.push_back(out + off);
                    len.push_back(row_len[r]);
                    head_off.push_back((hh / group) * d);
                }
            }
            attend<T>(qp.data(), op.data(), len.data(), head_off.data(), static_cast<int>(qp.size()), k_cache,
                      v_cache, block_tables + static_cast<int64_t>(row_seq[r0]) * table_width, hkv * d, d,
                      block_size, scale, w);
        }
    }
}

}  // namespace

extern "C" {

// 1 where this build has the AVX-512 decode tile (decode_row_fast), 0 on the portable build.
int lp_attention_decode_tile(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

void lp_paged_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt, int tw,
                            const int32_t* row_seq, const int32_t* row_len, float* out, int rows, int hq,
                            int hkv, int d, int bs, float scale, int threads, int decode_tile) {
    run<float>(q, k, v, bt, tw, row_seq, row_len, out, rows, hq, hkv, d, bs, scale, threads, decode_tile != 0);
}

void lp_paged_attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* bt, int tw,
                             const int32_t* row_seq, const int32_t* row_len, uint16_t* out, int rows, int hq,
                             int hkv, int d, int bs, float scale, int threads, int decode_tile) {
    run<uint16_t>(q, k, v, bt, tw, row_seq, row_len, out, rows, hq, hkv, d, bs, scale, threads, decode_tile != 0);
}

}  // extern "C"
