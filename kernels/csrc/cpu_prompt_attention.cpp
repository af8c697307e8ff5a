// Causal self-attention of prompt chunks in bf16 (a whole prompt, a later chunk of a chunked prompt
// or the rest of a prompt after a cached prefix; the chunk's keys and values already written to the
// paged cache), on CPUs with AVX512-BF16.
//
// Why: a serving step at 64 clients carries ~2 new 128-token prompts beside ~60 decodes, and torch's
// CPU flash attention (SDPA) ran those prompts at ~28 GFLOP/s (~32 ms of a ~240 ms step on the
// 2-core EPYC): for 128-token prompts its blocked loop is mostly overhead. Both products here are
// the bf16 linear kernel's vdpbf16ps over "pair panels" (pair_panel_dot.h): S = Q K^T with K packed
// as the "weight" (output columns = keys, k = head dim) and O = P V with V^T packed (output columns
// = head dim, k = keys), the scores and the softmax in fp32 between them.
//
// A chunk after a prefix: scheduled beside decodes, a 128-token prompt is prefilled 64 tokens a step,
// and the second chunk (64 rows over 128 keys) took ~0.6 ms a layer on the native two-pass tile
// (~19 ms of an ~86 ms step at 16 clients); the same products over its keys make it a whole prompt's
// cost.
//
// Work item: (sequence, KV head, block of kRows query rows), OpenMP-dynamic, the costliest (latest
// positions: the most keys) first. An item packs the keys 0 .. its last row's position of its KV head from the
// cache (k_cache / v_cache: bf16 [blocks, block_size, kv_heads, head_dim]) once for the query heads
// that share it (GQA), computes for each only the key panels its rows can see, and writes its rows
// of out.
// Arithmetic: each score is an fp32 sum over head-dim pairs in order (vdpbf16ps; denormal inputs read
// as zero, like the linear kernel), times scale; the softmax takes the row's max, exp in fp32, the
// row sum in fp32; the probabilities are rounded to bf16 for the second product (as torch's CPU
// flash attention rounds them), the fp32 output divided by the sum and rounded once to bf16. A row's
// result never depends on the other prompts of the call, the thread count or the item order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#include <omp.h>

#include "bf16.h"
#include "pair_panel_dot.h"
#include "simd_exp.h"

namespace {

using lp_pair::kPairElems;
using lp_pair::kPanel;
constexpr int kRows = 64;  // query rows per work item

struct Item {
    int seq, kv_head, r0;
};

inline int round_up(int v, int to) { return (v + to - 1) / to * to; }

// Keys 0 .. nk-1 of KV head kvh in pair panels of K: out[p][kk][j][t] = K[16p + j][2kk + t], zero
// for the keys nk .. nk16-1 (masked out by the softmax anyway).
void pack_keys(const uint16_t* cache, const int32_t* bt, int bs, int hkv, int kvh, int d, int nk, int nk16,
               uint16_t* out) {
    const int d2 = d / 2;
    for (int key = 0; key < nk16; ++key) {
        const int p = key / kPanel, j = key % kPanel;
        const uint16_t* src =
            key < nk ? cache + ((static_cast<int64_t>(bt[key / bs]) * bs + key % bs) * hkv + kvh) * d : nullptr;
        uint16_t* dst = out + static_cast<int64_t>(p) * d2 * kPairElems + 2 * j;
        for (int kk = 0; kk < d2; ++kk) {
            dst[kk * kPairElems] = src ? src[2 * kk] : 0;
            dst[kk * kPairElems + 1] = src ? src[2 * kk + 1] : 0;
        }
    }
}

// V^T of the same keys in pair panels: out[p][kk][j][t] = V[2kk + t][16p + j] (zero past nk).
void pack_values_t(const uint16_t* cache, const int32_t* bt, int bs, int hkv, int kvh, int d, int nk, int nk16,
                   uint16_t* out) {
    const int64_t panel_elems = static_cast<int64_t>(nk16 / 2) * kPairElems;
    for (int key = 0; key < nk16; ++key) {
        const int kk = key / 2, t = key % 2;
        const uint16_t* src =
            key < nk ? cache + ((static_cast<int64_t>(bt[key / bs]) * bs + key % bs) * hkv + kvh) * d : nullptr;
        for (int c = 0; c < d; ++c)
            out[(c / kPanel) * panel_elems + kk * kPairElems + 2 * (c % kPanel) + t] = src ? src[c] : 0;
    }
}

struct Scratch {
    std::vector<uint16_t> keys, values_t, probs;
    std::vector<float> scores, inv_sum;
};

#if defined(LP_DP_BF16)
template <int R, int NP, class Store>
inline void run_tile(const uint16_t* x, int64_t xs, int k2, const uint16_t* w, int64_t panel_elems, int row,
                     int panel, Store& store) {
    __m512 acc[R][NP];
    lp_pair::dot<R, NP>(acc, x + row * xs, xs, k2, w + panel * panel_elems, panel_elems);
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NP; ++j) store(row + r, panel + j, acc[r][j]);
}

// Rows [row, row + R) against the panels and k pairs ``limits`` allows them (causal: later rows see
// more keys), in groups of up to 3 panels.
template <int R, class Limits, class Store>
inline void row_tile(const uint16_t* x, int64_t xs, const uint16_t* w, int64_t panel_elems, int row, Limits& limits,
                     Store& store) {
    int panels = 0, k2 = 0;
    limits(row + R, panels, k2);
    int p = 0;
    for (; p + 3 <= panels; p += 3) run_tile<R, 3>(x, xs, k2, w, panel_elems, row, p, store);
    if (panels - p == 2) run_tile<R, 2>(x, xs, k2, w, panel_elems, row, p, store);
    if (panels - p == 1) run_tile<R, 1>(x, xs, k2, w, panel_elems, row, p, store);
}

template <class Limits, class Store>
void product(const uint16_t* x, int64_t xs, int m, const uint16_t* w, int64_t panel_elems, Limits limits,
             Store store) {
    int r = 0;
    for (; r + 8 <= m; r += 8) row_tile<8>(x, xs, w, panel_elems, r, limits, store);
    for (; r + 4 <= m; r += 4) row_tile<4>(x, xs, w, panel_elems, r, limits, store);
    for (; r < m; ++r) row_tile<1>(x, xs, w, panel_elems, r, limits, store);
}

// A row that sees keys 0 .. len - 1 (its position len - 1): its probabilities (bf16, zero past them,
// nk16 wide) and 1 / their fp32 sum.
void softmax_row(const float* s, int len, int nk16, uint16_t* p, float* inv_sum) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < len; j += 16) {
        const __mmask16 m = len - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - j)) - 1);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, s + j));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk16; j += 16) {
        const int left = len - j;
        const __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
        const __m512 e = _mm512_maskz_mov_ps(m, lp_simd::exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx)));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
    }
    *inv_sum = 1.0f / _mm512_reduce_add_ps(sum);
}

void item_fast(int off, int r0, const uint16_t* q, int64_t qs, uint16_t* out, int64_t os, int d, int r1, float scale,
               Scratch& sc) {
    const int m = r1 - r0, nk = off + r1, nk16 = round_up(nk, kPanel), p0 = off + r0;
    const uint16_t* x = q + static_cast<int64_t>(r0) * qs;
    // S = Q K^T * scale: a row tile ending at row e (position p0 + e - 1) sees keys < p0 + e, i.e.
    // that many panels.
    float* scores = sc.scores.data();
    product(
        x, qs, m, sc.keys.data(), static_cast<int64_t>(d / 2) * kPairElems,
        [&](int end, int& panels, int& k2) {
            panels = round_up(p0 + end < nk ? p0 + end : nk, kPanel) / kPanel;
            k2 = d / 2;
        },
        [&](int r, int p, __m512 acc) {
            _mm512_storeu_ps(scores + static_cast<int64_t>(r) * nk16 + p * kPanel, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
        });
    for (int r = 0; r < m; ++r)
        softmax_row(scores + static_cast<int64_t>(r) * nk16, p0 + r + 1, nk16, sc.probs.data() + static_cast<int64_t>(r) * nk16,
                    sc.inv_sum.data() + r);
    // O = P V / sum: a row tile ending at row e needs the key pairs below p0 + e.
    const float* inv = sc.inv_sum.data();
    product(
        sc.probs.data(), nk16, m, sc.values_t.data(), static_cast<int64_t>(nk16 / 2) * kPairElems,
        [&](int end, int& panels, int& k2) {
            panels = d / kPanel;
            k2 = round_up(p0 + end < nk ? p0 + end : nk, 2) / 2;
        },
        [&](int r, int p, __m512 acc) {
            const __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(acc, _mm512_set1_ps(inv[r])));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + static_cast<int64_t>(r0 + r) * os + p * kPanel),
                                reinterpret_cast<__m256i>(o));
        });
}
#endif

// Portable twin (a build without AVX512-BF16): the same packed layouts and the same order of sums,
// scalar; the engine keeps SDPA there (lp_prompt_attention_isa() = 0), the tests run it anywhere.
void item_portable(int off, int r0, const uint16_t* q, int64_t qs, uint16_t* out, int64_t os, int d, int r1,
                   float scale, Scratch& sc) {
    const int nk16 = round_up(off + r1, kPanel), d2 = d / 2;
    const int64_t vt_panel = static_cast<int64_t>(nk16 / 2) * kPairElems;
    std::vector<float> s(off + r1), e(off + r1);
    for (int i = r0; i < r1; ++i) {
        const uint16_t* qi = q + static_cast<int64_t>(i) * qs;
        const int pos = off + i;  // the row's position in its sequence: it sees keys 0 .. pos
        float mx = -INFINITY;
        for (int key = 0; key <= pos; ++key) {
            const uint16_t* kp = sc.keys.data() + static_cast<int64_t>(key / kPanel) * d2 * kPairElems + 2 * (key % kPanel);
            float acc = 0.f;
            for (int kk = 0; kk < d2; ++kk)
                acc += lp_bf16::bf2f(qi[2 * kk]) * lp_bf16::bf2f(kp[kk * kPairElems]) +
                       lp_bf16::bf2f(qi[2 * kk + 1]) * lp_bf16::bf2f(kp[kk * kPairElems + 1]);
            s[key] = acc * scale;
            mx = s[key] > mx ? s[key] : mx;
        }
        float sum = 0.f;
        for (int key = 0; key <= pos; ++key) {
            e[key] = std::exp(s[key] - mx);
            sum += e[key];
        }
        for (int c = 0; c < d; ++c) {
            const uint16_t* vp = sc.values_t.data() + (c / kPanel) * vt_panel + 2 * (c % kPanel);
            float acc = 0.f;
            for (int key = 0; key <= pos; ++key)
                acc += lp_bf16::bf2f(lp_bf16::f2bf(e[key])) * lp_bf16::bf2f(vp[(key / 2) * kPairElems + key % 2]);
            out[static_cast<int64_t>(i) * os + c] = lp_bf16::f2bf(acc / sum);
        }
    }
}

}  // namespace

extern "C" {

// 1 when this build has the vdpbf16ps kernel (0: the portable twin; the engine keeps SDPA).
int lp_prompt_attention_isa() {
#if defined(LP_DP_BF16)
    return 1;
#else
    return 0;
#endif
}

// q, out: bf16 [rows, hq, d], heads d apart, rows q_stride / out_stride apart (elements); sequence
// s's chunk is rows row_starts[s] .. + lens[s] of both, at positions offsets[s] .. + lens[s] - 1 of
// its sequence (offsets[s] keys before it already cached: a later chunk of a prompt or a prompt
// after a cached prefix; null offsets = whole prompts), its block table row
// block_tables[table_rows[s] * bt_stride]. The chunk's own keys and values are in the cache too.
// d a multiple of 16 (the caller keeps other head sizes on SDPA).
void lp_prompt_attention_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                              const int32_t* block_tables, int bt_stride, const int32_t* table_rows,
                              const int32_t* row_starts, const int32_t* lens, const int32_t* offsets, int n_seqs,
                              uint16_t* out, int64_t out_stride, int hq, int hkv, int d, int block_size, float scale,
                              int num_threads) {
    std::vector<Item> items;
    for (int s = 0; s < n_seqs; ++s)
        for (int r0 = 0; r0 < lens[s]; r0 += kRows)
            for (int kvh = 0; kvh < hkv; ++kvh) items.push_back({s, kvh, r0});
    auto off_of = [&](int s) { return offsets ? offsets[s] : 0; };
    // The latest positions see the most keys: hand those out first.
    std::stable_sort(items.begin(), items.end(),
                     [&](const Item& a, const Item& b) { return off_of(a.seq) + a.r0 > off_of(b.seq) + b.r0; });
    const int n_items = static_cast<int>(items.size());
    const int group = hq / hkv;
#pragma omp parallel num_threads(num_threads) if (n_items > 1 && num_threads > 1)
    {
        Scratch sc;
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n_items; ++i) {
            const Item& it = items[i];
            const int len = lens[it.seq], off = off_of(it.seq);
            const int r1 = it.r0 + kRows < len ? it.r0 + kRows : len;
            const int nk = off + r1, nk16 = round_up(nk, kPanel), m = r1 - it.r0;
            const int32_t* bt = block_tables + static_cast<int64_t>(table_rows[it.seq]) * bt_stride;
            sc.keys.resize(static_cast<size_t>(nk16) * d);
            sc.values_t.resize(static_cast<size_t>(nk16) * d);
            pack_keys(k_cache, bt, block_size, hkv, it.kv_head, d, nk, nk16, sc.keys.data());
            pack_values_t(v_cache, bt, block_size, hkv, it.kv_head, d, nk, nk16, sc.values_t.data());
            sc.scores.resize(static_cast<size_t>(m) * nk16);
            sc.probs.resize(static_cast<size_t>(m) * nk16);
            sc.inv_sum.resize(m);
            const int64_t row = row_starts[it.seq];
            for (int h = it.kv_head * group; h < (it.kv_head + 1) * group; ++h) {  // the query heads of this KV head
                const int64_t col = static_cast<int64_t>(h) * d;
#if defined(LP_DP_BF16)
                item_fast(off, it.r0, q + row * q_stride + col, q_stride, out + row * out_stride + col, out_stride, d,
                          r1, scale, sc);
#else
                item_portable(off, it.r0, q + row * q_stride + col, q_stride, out + row * out_stride + col, out_stride,
                              d, r1, scale, sc);
#endif
            }
        }
    }
}

}  // extern "C"
