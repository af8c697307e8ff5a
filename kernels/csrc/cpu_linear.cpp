// Decode-sized linear layers y = x W^T (+ bias) for a float32 model whose weights are exactly
// representable in bf16 (every bf16 checkpoint served in float32, e.g. on a CPU without native
// bf16): the weights are kept a second time in bf16, packed in panels of 16 output columns, and
// widened to fp32 in registers (a 16-bit shift: exact), so the product is the float32 model's,
// up to summation order, while a decode step streams half the weight bytes.
//
// Why: at decode batch sizes (8-64 rows) the float32 GEMM of a small model is bound by streaming
// the weights from memory, not by the FMAs (measured: 16 rows x [3072 x 576] reach ~4 GB/s of
// weights in MKL against ~8.5 GB/s for a plain read on this machine). Built with the other kernels
// into one library by kernels/cpu_native.py (same flags, same libgomp as torch).
//
// Layouts:
//   x:       float32 [m, k], row stride x_stride (elements), unit column stride
//   packed:  bf16 bits [ceil(n / 16), k, 16]: panel p holds output columns 16p..16p+15, k-major,
//            zero-padded past n
//   bias:    float32 [n] or null
//   y:       float32 [m, n], row stride y_stride
// Work: OpenMP over pairs of panels (32 output columns); inside, 8 rows at a time, every weight
// is loaded once per 8 rows and used by 8 FMAs. Items write disjoint columns of y, so the result
// does not depend on the thread count.
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"

using lp_bf16::bf2f;

namespace {

constexpr int kPanel = 16;
constexpr int kRows = 8;

#if defined(__AVX512F__)
inline __m512 load_panel(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// R rows x NP (1 or 2) panels: R * NP accumulators of 16 columns.
template <int R, int NP>
inline void tile(const float* x, int64_t xs, int k, const uint16_t* p0, const uint16_t* p1, const float* bias,
                 float* y, int64_t ys, int col0, int n) {
    __m512 acc[R][NP];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int kk = 0; kk < k; ++kk) {
        __m512 w[NP];
        w[0] = load_panel(p0 + static_cast<int64_t>(kk) * kPanel);
        if (NP == 2) w[NP - 1] = load_panel(p1 + static_cast<int64_t>(kk) * kPanel);
        if ((kk & 3) == 0) {  // 4 k-steps = 128 bytes of each panel: fetch ~1 KB ahead
            __builtin_prefetch(p0 + static_cast<int64_t>(kk + 32) * kPanel, 0, 0);
            if (NP == 2) __builtin_prefetch(p1 + static_cast<int64_t>(kk + 32) * kPanel, 0, 0);
        }
        for (int r = 0; r < R; ++r) {
            const __m512 xb = _mm512_set1_ps(x[r * xs + kk]);
            for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(xb, w[j], acc[r][j]);
        }
    }
    for (int j = 0; j < NP; ++j) {
        const int c = col0 + j * kPanel;
        const int valid = n - c < kPanel ? n - c : kPanel;
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
        for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ys + c, mask, _mm512_add_ps(acc[r][j], b));
    }
}

template <int NP>
inline void rows_of_pair(const float* x, int64_t xs, int m, int k, const uint16_t* p0, const uint16_t* p1,
                         const float* bias, float* y, int64_t ys, int col0, int n) {
    int r = 0;
    for (; r + kRows <= m; r += kRows) tile<kRows, NP>(x + r * xs, xs, k, p0, p1, bias, y + r * ys, ys, col0, n);
    const float* xr = x + r * xs;
    float* yr = y + r * ys;
    switch (m - r) {
        case 7: tile<7, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 6: tile<6, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 5: tile<5, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 4: tile<4, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 3: tile<3, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 2: tile<2, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        case 1: tile<1, NP>(xr, xs, k, p0, p1, bias, yr, ys, col0, n); break;
        default: break;
    }
}
#endif

// Portable fallback (a CPU without AVX-512): correct, not fast; lp_linear_fast() reports 0 there
// and the engine does not pack weights at all.
void pair_portable(const float* x, int64_t xs, int m, int k, const uint16_t* panels, int n_panels, int pair,
                   const float* bias, float* y, int64_t ys, int n) {
    for (int p = 2 * pair; p < 2 * pair + 2 && p < n_panels; ++p) {
        const uint16_t* w = panels + static_cast<int64_t>(p) * k * kPanel;
        for (int r = 0; r < m; ++r) {
            float acc[kPanel] = {0};
            for (int kk = 0; kk < k; ++kk) {
                const float xv = x[r * xs + kk];
                for (int j = 0; j < kPanel; ++j) acc[j] += xv * bf2f(w[kk * kPanel + j]);
            }
            for (int j = 0; j < kPanel && p * kPanel + j < n; ++j)
                y[r * ys + p * kPanel + j] = acc[j] + (bias ? bias[p * kPanel + j] : 0.f);
        }
    }
}

}  // namespace

extern "C" {

int lp_linear_fast() {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

void lp_linear_f32_bf16p(const float* x, int64_t x_stride, int m, int k, const uint16_t* packed, int n,
                         const float* bias, float* y, int64_t y_stride, int num_threads) {
    const int n_panels = (n + kPanel - 1) / kPanel;
    const int n_pairs = (n_panels + 1) / 2;
    if (m <= 0 || n <= 0) return;
    const int64_t panel_elems = static_cast<int64_t>(k) * kPanel;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_pairs > 1 && num_threads > 1)
    for (int pair = 0; pair < n_pairs; ++pair) {
#if defined(__AVX512F__)
        const uint16_t* p0 = packed + 2 * pair * panel_elems;
        const int col0 = 2 * pair * kPanel;
        if (2 * pair + 1 < n_panels)
            rows_of_pair<2>(x, x_stride, m, k, p0, p0 + panel_elems, bias, y, y_stride, col0, n);
        else
            rows_of_pair<1>(x, x_stride, m, k, p0, nullptr, bias, y, y_stride, col0, n);
#else
        pair_portable(x, x_stride, m, k, packed, n_panels, pair, bias, y, y_stride, n);
#endif
    }
}

}  // extern "C"
