// Grouped SGMV (LoRA shrink and expand) for CPU serving: the step's tokens are grouped by adapter
// slot, and each adapter's A rows / B column chunks are read once per group of tokens instead of
// being gathered (copied) once per token as the torch path does.
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
// Accumulation is fp32 for fp32 and bf16 storage.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#include <omp.h>

namespace {

inline float to_f(float x) { return x; }
inline float to_f(uint16_t x) {
    uint32_t u = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline void from_f(float x, float* dst) { *dst = x; }
inline void from_f(float x, uint16_t* dst) {
    // Branch-free (a select, not a jump) so the row update loop vectorises.
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even, like torch
    const uint32_t nan = (u >> 16) | 0x40u;                             // quiet NaN keeps its sign
    *dst = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

template <typename T>
inline void load_row(const T* src, int n, float* dst) {
#pragma omp simd
    for (int i = 0; i < n; ++i) dst[i] = to_f(src[i]);
}

constexpr int kShrinkTile = 16;   // tokens of one group sharing each A row load
constexpr int kExpandTile = 32;   // tokens of one group sharing each B chunk load
constexpr int kExpandCols = 256;  // B columns per work item (rank x 256 values stay in L1 across tokens)

struct Item {
    int group, tile, part;  // part: slice (shrink) or column chunk (expand)
};

template <typename T>
void shrink(const T* x, int64_t x_stride, const T* a, float* out, int num_tokens, int hidden, int num_slices,
            int num_slots, int max_rank, const int32_t* ranks, const int32_t* group_slot,
            const int32_t* group_start, int num_groups, const int32_t* token_idx, int num_threads) {
    std::vector<Item> items;
    for (int g = 0; g < num_groups; ++g) {
        const int slot = group_slot[g];
        if (slot < 0 || slot >= num_slots || ranks[slot] <= 0) continue;
        const int n = group_start[g + 1] - group_start[g];
        for (int tile = 0; tile * kShrinkTile < n; ++tile)
            for (int s = 0; s < num_slices; ++s) items.push_back({g, tile, s});
    }
    const int n_items = static_cast<int>(items.size());
#pragma omp parallel num_threads(num_threads) if (n_items > 1)
    {
        std::vector<float> xs(static_cast<size_t>(kShrinkTile) * hidden);
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; ++it) {
            const Item& item = items[it];
            const int slot = group_slot[item.group];
            const int rank = std::min(ranks[slot], max_rank);
            const int t0 = group_start[item.group] + item.tile * kShrinkTile;
            const int t1 = std::min(t0 + kShrinkTile, group_start[item.group + 1]);
            const int nt = t1 - t0;
            for (int j = 0; j < nt; ++j)
                load_row(x + static_cast<int64_t>(token_idx[t0 + j]) * x_stride, hidden, xs.data() + j * hidden);
            const T* a_slot = a + (static_cast<int64_t>(item.part) * num_slots + slot) * max_rank * hidden;
            float* out_slice = out + static_cast<int64_t>(item.part) * num_tokens * max_rank;
            for (int r = 0; r < rank; ++r) {
                // Converted in-register (bf16 -> fp32 is a shift): no scratch copy of the A row.
                const T* ar = a_slot + static_cast<int64_t>(r) * hidden;
                for (int j = 0; j < nt; ++j) {
                    const float* xr = xs.data() + j * hidden;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < hidden; ++i) dot += to_f(ar[i]) * xr[i];
                    out_slice[static_cast<int64_t>(token_idx[t0 + j]) * max_rank + r] = dot;
                }
            }
        }
    }
}

template <typename T>
void expand(T* y, int64_t y_stride, const float* shrunk, const T* b, int num_tokens, int total_out, int num_slots,
            int max_rank, const int32_t* ranks, const float* scales, const int32_t* offsets, int num_slices,
            const int32_t* group_slot, const int32_t* group_start, int num_groups, const int32_t* token_idx,
            int num_threads) {
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
        for (int tile = 0; tile * kExpandTile < n; ++tile)
            for (int c = 0; c < n_chunks; ++c) items.push_back({g, tile, c});
    }
    const int n_items = static_cast<int>(items.size());
    // Items write disjoint (token, column) regions of y: tokens of different groups are distinct
    // and chunks of one group are distinct columns.
#pragma omp parallel num_threads(num_threads) if (n_items > 1)
    {
        std::vector<float> acc(kExpandCols);
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_items; ++it) {
            const Item& item = items[it];
            const int slot = group_slot[item.group];
            const int rank = std::min(ranks[slot], max_rank);
            const float scale = scales[slot];
            const int s = chunk_slice[item.part];
            const int c0 = chunk_lo[item.part];
            const int w = std::min(kExpandCols, offsets[s + 1] - c0);
            const T* b_slot = b + static_cast<int64_t>(slot) * max_rank * total_out + c0;
            const float* sh = shrunk + static_cast<int64_t>(s) * num_tokens * max_rank;
            const int t0 = group_start[item.group] + item.tile * kExpandTile;
            const int t1 = std::min(t0 + kExpandTile, group_start[item.group + 1]);
            for (int t = t0; t < t1; ++t) {
                const int64_t tok = token_idx[t];
                const float* st = sh + tok * max_rank;
                float* ac = acc.data();
                std::fill(ac, ac + w, 0.f);
                for (int r = 0; r < rank; ++r) {
                    const float sv = st[r];
                    const T* br = b_slot + static_cast<int64_t>(r) * total_out;
#pragma omp simd
                    for (int i = 0; i < w; ++i) ac[i] += sv * to_f(br[i]);
                }
                T* yr = y + tok * y_stride + c0;
#pragma omp simd
                for (int i = 0; i < w; ++i) from_f(to_f(yr[i]) + scale * ac[i], yr + i);
            }
        }
    }
}

}  // namespace

extern "C" {

void lp_sgmv_shrink_f32(const float* x, int64_t xs, const float* a, float* out, int nt, int h, int ns, int nl,
                        int mr, const int32_t* ranks, const int32_t* gs, const int32_t* gst, int ng,
                        const int32_t* ti, int threads) {
    shrink<float>(x, xs, a, out, nt, h, ns, nl, mr, ranks, gs, gst, ng, ti, threads);
}

void lp_sgmv_shrink_bf16(const uint16_t* x, int64_t xs, const uint16_t* a, float* out, int nt, int h, int ns,
                         int nl, int mr, const int32_t* ranks, const int32_t* gs, const int32_t* gst, int ng,
                         const int32_t* ti, int threads) {
    shrink<uint16_t>(x, xs, a, out, nt, h, ns, nl, mr, ranks, gs, gst, ng, ti, threads);
}

void lp_sgmv_expand_f32(float* y, int64_t ys, const float* sh, const float* b, int nt, int to, int nl, int mr,
                        const int32_t* ranks, const float* scales, const int32_t* offs, int ns, const int32_t* gs,
                        const int32_t* gst, int ng, const int32_t* ti, int threads) {
    expand<float>(y, ys, sh, b, nt, to, nl, mr, ranks, scales, offs, ns, gs, gst, ng, ti, threads);
}

void lp_sgmv_expand_bf16(uint16_t* y, int64_t ys, const float* sh, const uint16_t* b, int nt, int to, int nl,
                         int mr, const int32_t* ranks, const float* scales, const int32_t* offs, int ns,
                         const int32_t* gs, const int32_t* gst, int ng, const int32_t* ti, int threads) {
    expand<uint16_t>(y, ys, sh, b, nt, to, nl, mr, ranks, scales, offs, ns, gs, gst, ng, ti, threads);
}

}  // extern "C"
