// INT4 weight-only linear layers y = x W^T (+ bias) for decode-sized batches, reading the packed
// 4-bit codes directly (two per byte) and dequantizing them in registers.
//
// Why: decode is bound by streaming weights; 4-bit codes are 1/8 of the float32 bytes and 1/4 of
// bf16's. The dequantization (nibble -> int -> float, one FMA with the group's scale and offset)
// costs a few vector instructions per 8 weights, paid once per row tile and shared by its rows.
// Prefill-sized batches do not come here: they dequantize once (lp_int4_dequant_f32) and run the
// dense GEMM (kernels/int4.py decides). Built with the other kernels into one library by
// kernels/cpu_native.py (-march=native); three paths by what the compiler may use:
// AVX-512F, AVX2+FMA, and a portable scalar loop (lp_int4_isa() says which one was built).
//
// Layouts (kernels/int4.py writes them):
//   codes:  uint8 [n, kp / 2], kp = the input size padded to a multiple of the group size (itself a
//           multiple of 32). Each 32-wide chunk of a row is 16 bytes: byte j holds column j of the
//           chunk in its low nibble and column 16 + j in its high nibble, so the low nibbles of a
//           16-byte load are 16 consecutive columns and the high nibbles the next 16 (no shuffle).
//   scales, offsets: float32 [n, kp / group]: weight = code * scale + offset (offset = -zero * scale).
//   x:      float32 [m, kp] (zero-padded past the real input size), row stride x_stride
//   bias:   float32 [n] or null;   y: float32 [m, n], row stride y_stride
// Work: OpenMP over output columns; each column's dot products are summed by one thread in a fixed
// order, so the result does not depend on the thread count.
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int kChunk = 32;  // columns per 16-byte code chunk
constexpr int kRows = 4;    // rows per tile: every dequantized weight vector serves this many rows

#if defined(__AVX512F__)
// R rows x one output column: 2 accumulators of 16 lanes per row (low / high nibbles).
template <int R>
inline void column(const float* x, int64_t xs, int kp, int group, const uint8_t* codes, const float* scales,
                   const float* offsets, float out[R]) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const int groups = kp / group;
    for (int g = 0; g < groups; ++g) {
        const __m512 s = _mm512_set1_ps(scales[g]);
        const __m512 o = _mm512_set1_ps(offsets[g]);
        for (int k0 = g * group; k0 < (g + 1) * group; k0 += kChunk) {
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k0 / 2));
            const __m128i lo = _mm_and_si128(b, low4);
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            const __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), s, o);
            const __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), s, o);
            for (int r = 0; r < R; ++r) {
                const float* xr = x + r * xs + k0;
                acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xr), w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16), w1, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }

// R rows x one output column. NA accumulators of 8 lanes per row: a single row needs 4 independent
// FMA chains to hide the FMA latency (2 chains halved its speed); 4 rows x 2 fill the 16 registers.
template <int R>
inline void column(const float* x, int64_t xs, int kp, int group, const uint8_t* codes, const float* scales,
                   const float* offsets, float out[R]) {
    constexpr int NA = R <= 2 ? 4 : 2;
    __m256 acc[R][NA];
    for (int r = 0; r < R; ++r)
        for (int a = 0; a < NA; ++a) acc[r][a] = _mm256_setzero_ps();
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const int groups = kp / group;
    for (int g = 0; g < groups; ++g) {
        const __m256 s = _mm256_set1_ps(scales[g]);
        const __m256 o = _mm256_set1_ps(offsets[g]);
        for (int k0 = g * group; k0 < (g + 1) * group; k0 += kChunk) {
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k0 / 2));
            const __m128i lo = _mm_and_si128(b, low4);
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            const __m256 w[4] = {
                _mm256_fmadd_ps(widen8(lo), s, o),                     // columns 0..7
                _mm256_fmadd_ps(widen8(_mm_srli_si128(lo, 8)), s, o),  // 8..15
                _mm256_fmadd_ps(widen8(hi), s, o),                     // 16..23
                _mm256_fmadd_ps(widen8(_mm_srli_si128(hi, 8)), s, o),  // 24..31
            };
            for (int r = 0; r < R; ++r) {
                const float* xr = x + r * xs + k0;
                for (int i = 0; i < 4; ++i)
                    acc[r][i % NA] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * i), w[i], acc[r][i % NA]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        __m256 t = acc[r][0];
        for (int a = 1; a < NA; ++a) t = _mm256_add_ps(t, acc[r][a]);
        out[r] = hsum256(t);
    }
}
#else
// Portable fallback: correct, not fast.
template <int R>
inline void column(const float* x, int64_t xs, int kp, int group, const uint8_t* codes, const float* scales,
                   const float* offsets, float out[R]) {
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    for (int k0 = 0; k0 < kp; k0 += kChunk) {
        const float s = scales[k0 / group], o = offsets[k0 / group];
        for (int j = 0; j < 16; ++j) {
            const uint8_t b = codes[k0 / 2 + j];
            const float w_lo = static_cast<float>(b & 0x0F) * s + o;
            const float w_hi = static_cast<float>(b >> 4) * s + o;
            for (int r = 0; r < R; ++r) acc[r] += x[r * xs + k0 + j] * w_lo + x[r * xs + k0 + 16 + j] * w_hi;
        }
    }
    for (int r = 0; r < R; ++r) out[r] = acc[r];
}
#endif

template <int R>
inline void tile(const float* x, int64_t xs, int kp, int group, const uint8_t* codes, const float* scales,
                 const float* offsets, const float* bias, float* y, int64_t ys, int col) {
    float out[R];
    column<R>(x, xs, kp, group, codes, scales, offsets, out);
    const float b = bias ? bias[col] : 0.f;
    for (int r = 0; r < R; ++r) y[r * ys + col] = out[r] + b;
}

}  // namespace

extern "C" {

// 2: AVX-512F, 1: AVX2+FMA, 0: portable (which path this build of the library runs).
int lp_int4_isa() {
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

void lp_int4_linear_f32(const float* x, int64_t x_stride, int m, int kp, const uint8_t* codes, const float* scales,
                        const float* offsets, int n, int group, const float* bias, float* y, int64_t y_stride,
                        int num_threads) {
    if (m <= 0 || n <= 0 || kp <= 0 || group <= 0 || group % kChunk != 0 || kp % group != 0) return;
    const int groups = kp / group;
    const int64_t row_bytes = kp / 2;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n > 1 && num_threads > 1)
    for (int col = 0; col < n; ++col) {
        const uint8_t* c = codes + col * row_bytes;
        const float* s = scales + static_cast<int64_t>(col) * groups;
        const float* o = offsets + static_cast<int64_t>(col) * groups;
        int r = 0;
        for (; r + kRows <= m; r += kRows)
            tile<kRows>(x + r * x_stride, x_stride, kp, group, c, s, o, bias, y + r * y_stride, y_stride, col);
        const float* xr = x + r * x_stride;
        float* yr = y + r * y_stride;
        switch (m - r) {
            case 3: tile<3>(xr, x_stride, kp, group, c, s, o, bias, yr, y_stride, col); break;
            case 2: tile<2>(xr, x_stride, kp, group, c, s, o, bias, yr, y_stride, col); break;
            case 1: tile<1>(xr, x_stride, kp, group, c, s, o, bias, yr, y_stride, col); break;
            default: break;
        }
    }
}

// The whole float32 weight [n, kp] (code * scale + offset), for prefill-sized batches' dense GEMM.
void lp_int4_dequant_f32(const uint8_t* codes, const float* scales, const float* offsets, int n, int kp, int group,
                         float* out, int num_threads) {
    if (n <= 0 || kp <= 0 || group <= 0 || group % kChunk != 0 || kp % group != 0) return;
    const int groups = kp / group;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n > 1 && num_threads > 1)
    for (int col = 0; col < n; ++col) {
        const uint8_t* c = codes + static_cast<int64_t>(col) * (kp / 2);
        float* w = out + static_cast<int64_t>(col) * kp;
        for (int k0 = 0; k0 < kp; k0 += kChunk) {
            const int g = k0 / group;
            const float s = scales[static_cast<int64_t>(col) * groups + g];
            const float o = offsets[static_cast<int64_t>(col) * groups + g];
            // Written as a plain loop: -O3 vectorizes it on every ISA (one pass over the output).
            for (int j = 0; j < 16; ++j) {
                const uint8_t b = c[k0 / 2 + j];
                w[k0 + j] = static_cast<float>(b & 0x0F) * s + o;
                w[k0 + 16 + j] = static_cast<float>(b >> 4) * s + o;
            }
        }
    }
}

}  // extern "C"
