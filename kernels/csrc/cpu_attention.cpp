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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <omp.h>

#include "bf16.h"

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

template <typename T>
void run(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_tables, int table_width,
         const int32_t* row_seq, const int32_t* row_len, T* out, int num_rows, int hq, int hkv, int d,
         int block_size, float scale, int num_threads) {
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

void lp_paged_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt, int tw,
                            const int32_t* row_seq, const int32_t* row_len, float* out, int rows, int hq,
                            int hkv, int d, int bs, float scale, int threads) {
    run<float>(q, k, v, bt, tw, row_seq, row_len, out, rows, hq, hkv, d, bs, scale, threads);
}

void lp_paged_attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int32_t* bt, int tw,
                             const int32_t* row_seq, const int32_t* row_len, uint16_t* out, int rows, int hq,
                             int hkv, int d, int bs, float scale, int threads) {
    run<uint16_t>(q, k, v, bt, tw, row_seq, row_len, out, rows, hq, hkv, d, bs, scale, threads);
}

}  // extern "C"
