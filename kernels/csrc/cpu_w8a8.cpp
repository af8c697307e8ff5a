// The two element-wise passes around W8A8's integer GEMM (kernels/w8a8.py): the per-row dynamic
// int8 quantizer of the activations, and the epilogue that turns the int32 accumulators into the
// activation dtype. The GEMM itself is torch._int_mm (oneDNN's u8s8 VNNI kernel on this CPU),
// measured faster than anything we would write here (benchmarks/kernels/cpu_w8a8.py).
//
// Why native: in torch the quantizer is ~5 passes over the activations (cast, abs, amax, divide,
// round, clamp, cast) with a temporary each, and the epilogue 3 (cast, two multiplies, a cast);
// measured on a 2048 x 1536 prefill chunk they cost as much as the int8 GEMM. Here each is one
// pass over rows that stay in L1 (the quantizer reads a row twice: its max, then its codes).
//
// Same numbers as the torch oracle (w8a8.quantize_rows_int8): scale = amax / 127 in float32 (1
// for an all-zero row), code = round-half-even(x / scale) clamped to +-127, computed as an IEEE
// float32 division (no reciprocal): the codes and scales are bit-identical to torch's. The
// epilogue computes (float(acc) * xscale[row]) * wscale[col] (+ bias[col]) in float32, then rounds
// once to the output dtype (bf16: round to nearest even, as torch).
//
// Layouts: x [rows, k] with a row stride in elements, unit column stride (f32, or bf16 as uint16
// bits); codes int8 [rows, k] dense; scales float32 [rows]; acc int32 [rows, n] dense; out
// [rows, n] dense. OpenMP over rows: every row is computed alone, so a row's numbers never depend
// on the other rows of the batch or on the thread count (multi-tenant batches).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define LP_W8A8_AVX512 1
#endif

#include "bf16.h"

using lp_bf16::bf2f;
using lp_bf16::f2bf;

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return bf2f(p[i]); }

#if defined(LP_W8A8_AVX512)
// 16 lanes of a row as float32; bf16 widens by a shift (exact). Masked loads for the tail.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

template <typename T>
void quant_row_avx512(const T* xr, int k, int8_t* qr, float* scale) {
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 vmax = _mm512_setzero_ps();
    for (int j = 0; j < k; j += 16) {
        const __mmask16 m = k - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (k - j)) - 1);
        vmax = _mm512_max_ps(vmax, _mm512_and_ps(load16(xr + j, m), absmask));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    *scale = s;
    const __m512 vs = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int j = 0; j < k; j += 16) {
        const __mmask16 m = k - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (k - j)) - 1);
        __m512 v = _mm512_div_ps(load16(xr + j, m), vs);  // a true IEEE division, as torch's
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // half to even
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        _mm_mask_storeu_epi8(qr + j, m, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
    }
}
#endif

template <typename T>
void quant_rows(const T* x, int64_t xs, int rows, int k, int8_t* q, float* scales, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int r = 0; r < rows; ++r) {
        const T* xr = x + static_cast<int64_t>(r) * xs;
#if defined(LP_W8A8_AVX512)
        quant_row_avx512(xr, k, q + static_cast<int64_t>(r) * k, scales + r);
        continue;
#endif
        float amax = 0.0f;
        // Written as plain loops: -O3 -march=native vectorizes both (max is order-independent).
        for (int j = 0; j < k; ++j) amax = std::fmax(amax, std::fabs(load(xr, j)));
        const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        scales[r] = s;
        int8_t* qr = q + static_cast<int64_t>(r) * k;
        for (int j = 0; j < k; ++j) {
            float v = std::nearbyint(load(xr, j) / s);  // default rounding mode: half to even
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            qr[j] = static_cast<int8_t>(v);
        }
    }
}

inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = f2bf(v); }

template <typename T>
void rescale(const int32_t* acc, int rows, int n, const float* xscale, const float* wscale, const float* bias, T* out,
             int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int r = 0; r < rows; ++r) {
        const int32_t* a = acc + static_cast<int64_t>(r) * n;
        T* o = out + static_cast<int64_t>(r) * n;
        const float xsr = xscale[r];
        if (bias) {
            for (int j = 0; j < n; ++j) store(o, j, static_cast<float>(a[j]) * xsr * wscale[j] + bias[j]);
        } else {
            for (int j = 0; j < n; ++j) store(o, j, static_cast<float>(a[j]) * xsr * wscale[j]);
        }
    }
}

}  // namespace

extern "C" {

// Which quantizer was built: 1 AVX-512 (F+BW), 0 the portable loop (same numbers).
int lp_w8a8_isa() {
#if defined(LP_W8A8_AVX512)
    return 1;
#else
    return 0;
#endif
}

void lp_w8a8_quant_rows_f32(const float* x, int64_t xs, int rows, int k, int8_t* q, float* scales, int threads) {
    quant_rows(x, xs, rows, k, q, scales, threads);
}

void lp_w8a8_quant_rows_bf16(const uint16_t* x, int64_t xs, int rows, int k, int8_t* q, float* scales,
                             int threads) {
    quant_rows(x, xs, rows, k, q, scales, threads);
}

void lp_w8a8_rescale_f32(const int32_t* acc, int rows, int n, const float* xscale, const float* wscale,
                         const float* bias, float* out, int threads) {
    rescale(acc, rows, n, xscale, wscale, bias, out, threads);
}

void lp_w8a8_rescale_bf16(const int32_t* acc, int rows, int n, const float* xscale, const float* wscale,
                          const float* bias, uint16_t* out, int threads) {
    rescale(acc, rows, n, xscale, wscale, bias, out, threads);
}

}  // extern "C"
