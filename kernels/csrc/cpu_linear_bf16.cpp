// bf16 linear layers y = x W^T (+ bias) for a bf16 model on a CPU with AVX512-BF16 (Zen 4, Cooper
// Lake, Sapphire Rapids...), on a weight packed once at load in "pair panels".
//
// Why: at decode batch sizes (1-64 rows) oneDNN's packed bf16 GEMM (what torch's mkldnn ops run)
// reached ~60% of this machine's best bf16 rate at 16 rows and ~80% at 64, and a decode step is
// mostly such GEMMs; this kernel runs a step's GEMMs 1.16-1.38x faster at 1-64 rows and as fast at
// prefill sizes (docs/cpu-performance.md, "A decode GEMM of our own"). Here three
// AVX-512 registers of weights (48 output columns x 2 consecutive k) feed up to 8 rows'
// dot-product instructions (vdpbf16ps) straight from the stream, with the next kilobyte prefetched.
//
// Layouts (kernels/pair_panels.py packs and unpacks them):
//   packed:  bf16 bits [n / 16, k / 2, 16, 2]: element [p][kk][j][t] = W[16p + j][2kk + t]
//            (n a multiple of 16, k even: the packer keeps other shapes on oneDNN)
//   x:       bf16 [m, k], row stride x_stride (elements), unit column stride
//   bias:    bf16 [n] or null
//   y:       bf16 [m, n], row stride y_stride
// Arithmetic: each output is an fp32 accumulation over k in pairs, in k order (vdpbf16ps: both
// products of a pair added to the accumulator, denormal inputs read as zero, as oneDNN's own
// AVX512-BF16 kernels do), plus the bias in fp32, rounded once to bf16 (nearest even). A row's
// arithmetic never depends on m, on the other rows or on the thread count (work is split by
// output columns; every row tile runs the same instruction sequence per row): batch invariant.
// Work: rows in blocks of kRowBlock (their x stays in L2 while every panel group passes); inside a
// block OpenMP splits the groups of kGroup panels (48 output columns), and each group's weights
// (k x 48 x 2 B) are read from memory once per block and from cache by the block's further row
// tiles. (8 rows x 3 panels measured 3-8% faster than 12 x 2 from 256 rows on, and as fast below.)
#include <omp.h>

#include "bf16.h"
#include "pair_panel_dot.h"

namespace {

using lp_pair::kPairElems;
using lp_pair::kPanel;
constexpr int kGroup = 3;         // panels per work item and tile
constexpr int kTileRows = 8;      // rows per full tile: 8 x 3 accumulators + 3 weights + 1 broadcast
constexpr int kRowBlock = 16 * kTileRows;

#if defined(LP_DP_BF16)
// R rows x NP (1 to kGroup) panels: R * NP accumulators.
template <int R, int NP>
inline void tile(const uint16_t* x, int64_t xs, int k2, const uint16_t* w, int64_t panel_elems,
                 const uint16_t* bias, uint16_t* y, int64_t ys, int col0) {
    __m512 acc[R][NP];
    lp_pair::dot<R, NP>(acc, x, xs, k2, w, panel_elems);
    for (int j = 0; j < NP; ++j) {
        const int c = col0 + j * kPanel;
        __m512 bv = _mm512_setzero_ps();
        if (bias)
            bv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + c))), 16));
        for (int r = 0; r < R; ++r) {
            const __m256bh o = _mm512_cvtneps_pbh(bias ? _mm512_add_ps(acc[r][j], bv) : acc[r][j]);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ys + c), reinterpret_cast<__m256i>(o));
        }
    }
}

template <int NP>
inline void rows_of_group(const uint16_t* x, int64_t xs, int m, int k2, const uint16_t* w, int64_t panel_elems,
                          const uint16_t* bias, uint16_t* y, int64_t ys, int col0) {
    int r = 0;
    for (; r + kTileRows <= m; r += kTileRows)
        tile<kTileRows, NP>(x + r * xs, xs, k2, w, panel_elems, bias, y + r * ys, ys, col0);
    for (; r + 4 <= m; r += 4) tile<4, NP>(x + r * xs, xs, k2, w, panel_elems, bias, y + r * ys, ys, col0);
    for (; r < m; ++r) tile<1, NP>(x + r * xs, xs, k2, w, panel_elems, bias, y + r * ys, ys, col0);
}
#endif

// Portable twin (a build without AVX512-BF16): the same layout, each column's fp32 sum over the k
// pairs in k order; not fast. lp_linear_bf16_dp_isa() reports 0 and the engine keeps oneDNN there,
// but the tests run the layout and the bookkeeping on any CPU. (Column by column on purpose: GCC
// 12's -O3 vectorized the row-of-16-accumulators form of this loop into wrong sums.)
void rows_portable(const uint16_t* x, int64_t xs, int m, int k2, const uint16_t* w, const uint16_t* bias,
                   uint16_t* y, int64_t ys, int col0) {
    for (int r = 0; r < m; ++r)
        for (int j = 0; j < kPanel; ++j) {
            float acc = 0.f;
            for (int kk = 0; kk < k2; ++kk) {
                const uint16_t* wp = w + static_cast<int64_t>(kk) * kPairElems + 2 * j;
                acc += lp_bf16::bf2f(x[r * xs + 2 * kk]) * lp_bf16::bf2f(wp[0]) +
                       lp_bf16::bf2f(x[r * xs + 2 * kk + 1]) * lp_bf16::bf2f(wp[1]);
            }
            y[r * ys + col0 + j] = lp_bf16::f2bf(acc + (bias ? lp_bf16::bf2f(bias[col0 + j]) : 0.f));
        }
}

}  // namespace

extern "C" {

// 1 when this build has the vdpbf16ps kernel (0: the portable twin; the packer keeps oneDNN's copy).
int lp_linear_bf16_dp_isa() {
#if defined(LP_DP_BF16)
    return 1;
#else
    return 0;
#endif
}

void lp_linear_bf16_dp(const uint16_t* x, int64_t x_stride, int m, int k, const uint16_t* packed, int n,
                       const uint16_t* bias, uint16_t* y, int64_t y_stride, int num_threads) {
#if defined(LP_DP_BF16)
    if (m <= 0 || n <= 0) return;
    const int n_panels = n / kPanel;
    const int n_groups = (n_panels + kGroup - 1) / kGroup;
    const int k2 = k / 2;
    const int64_t panel_elems = static_cast<int64_t>(k2) * kPairElems;
#pragma omp parallel num_threads(num_threads) if (n_groups > 1 && num_threads > 1)
    for (int r0 = 0; r0 < m; r0 += kRowBlock) {
        const int rows = m - r0 < kRowBlock ? m - r0 : kRowBlock;
        const uint16_t* xb = x + static_cast<int64_t>(r0) * x_stride;
        uint16_t* yb = y + static_cast<int64_t>(r0) * y_stride;
#pragma omp for schedule(static) nowait
        for (int g = 0; g < n_groups; ++g) {
            const uint16_t* w = packed + kGroup * g * panel_elems;
            const int col0 = kGroup * g * kPanel;
            switch (n_panels - kGroup * g < kGroup ? n_panels - kGroup * g : kGroup) {
                case 3: rows_of_group<3>(xb, x_stride, rows, k2, w, panel_elems, bias, yb, y_stride, col0); break;
                case 2: rows_of_group<2>(xb, x_stride, rows, k2, w, panel_elems, bias, yb, y_stride, col0); break;
                default: rows_of_group<1>(xb, x_stride, rows, k2, w, panel_elems, bias, yb, y_stride, col0); break;
            }
        }
    }
#else
    if (m <= 0 || n <= 0) return;
    const int k2 = k / 2;
    const int64_t panel_elems = static_cast<int64_t>(k2) * kPairElems;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int p = 0; p < n / kPanel; ++p)
        rows_portable(x, x_stride, m, k2, packed + p * panel_elems, bias, y, y_stride, p * kPanel);
#endif
}

}  // extern "C"
