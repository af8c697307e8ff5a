// The element-wise glue of a bf16 decoder layer, one pass each: RMSNorm, SiLU(gate) x up and the
// rotary embedding; and the KV write (a copy per token), which torch did in ~6 ops per layer.
//
// Why: on a CPU with AMX the bf16 GEMMs of a prefill chunk run at ~1 TFLOP/s per core, and the
// glue between them became the larger share of a prefill step (profiled on an AMX Xeon, 16 x 128
// tokens of SmolLM2-135M: element-wise ops 531 ms against the GEMMs' 430 ms). In torch each
// RMSNorm is ~7 passes over the activations (cast, pow, mean, add, rsqrt, mul, cast, mul by the
// weight) with a temporary per pass; SiLU x up is 2 passes and a temporary. Here each is one pass
// over rows that stay in L1.
//
// Same numbers as torch's bf16 ops, which round to bf16 after every op: RMSNorm computes in fp32,
// rounds x * rsqrt(mean(x^2) + eps) to bf16, multiplies by the bf16 weight in fp32 and rounds
// again (HF's LlamaRMSNorm); SiLU rounds silu(gate) to bf16, then the product with up. Only the
// order of the fp32 sum of squares and the exp's last bits differ from torch: a result may differ
// by one bf16 ulp where the fp32 value lies on a rounding boundary.
//
// Layouts (bf16 as uint16 bits, rows with a row stride in elements, unit column stride):
//   rms_norm:  x [rows, h] (stride xs) -> out [rows, h] (dense); weight [h]
//   silu_mul:  gu [rows, 2n] (stride gs): gate = columns 0..n-1, up = n..2n-1 -> out [rows, n] (dense)
// OpenMP over rows (rows are independent: the result does not depend on the thread count).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "simd_exp.h"

using lp_bf16::bf2f;
using lp_bf16::f2bf;

namespace {

#if defined(__AVX512F__)
inline __m512 load_bf(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load_bf_n(const uint16_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m256i to_bf(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
inline __m512 to_bf_f(__m512 f) {  // round to bf16 and widen back
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf(f)), 16));
}
#endif

void rms_norm_row(const uint16_t* x, const uint16_t* w, float eps, int h, uint16_t* out) {
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= h; j += 16) {
        __m512 v = load_bf(x + j);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    __mmask16 tail = static_cast<__mmask16>((1u << (h - j)) - 1u);
    if (tail) {
        __m512 v = load_bf_n(x + j, tail);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(h) + eps);
    __m512 rv = _mm512_set1_ps(r);
    for (j = 0; j + 16 <= h; j += 16) {
        __m512 y = _mm512_mul_ps(load_bf(w + j), to_bf_f(_mm512_mul_ps(load_bf(x + j), rv)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), to_bf(y));
    }
    if (tail) {
        __m512 y = _mm512_mul_ps(load_bf_n(w + j, tail), to_bf_f(_mm512_mul_ps(load_bf_n(x + j, tail), rv)));
        _mm256_mask_storeu_epi16(out + j, tail, to_bf(y));
    }
#else
    float s = 0.0f;
    for (int j = 0; j < h; ++j) s += bf2f(x[j]) * bf2f(x[j]);
    float r = 1.0f / std::sqrt(s / static_cast<float>(h) + eps);
    for (int j = 0; j < h; ++j) out[j] = f2bf(bf2f(w[j]) * bf2f(f2bf(bf2f(x[j]) * r)));
#endif
}

void silu_mul_row(const uint16_t* g, const uint16_t* u, int n, uint16_t* out) {
    int j = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= n; j += 16) {
        __m512 x = load_bf(g + j);
        __m512 s = to_bf_f(_mm512_div_ps(x, _mm512_add_ps(one, lp_simd::exp512(_mm512_sub_ps(_mm512_setzero_ps(), x)))));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), to_bf(_mm512_mul_ps(s, load_bf(u + j))));
    }
#endif
    for (; j < n; ++j) {
        float x = bf2f(g[j]);
        out[j] = f2bf(bf2f(f2bf(x / (1.0f + std::exp(-x)))) * bf2f(u[j]));
    }
}


// Rotate-half RoPE of one token's heads [heads, d] (row of the fused q|k projection): out[h, j] =
// x1*c - x2*s, out[h, j + d/2] = x2*c + x1*s, j < d/2, with c, s this token's bf16 cos/sin rows.
// torch's bf16 ops round each product and the sum: so do we (each product of two bf16 numbers is
// exact in fp32, so the results are torch's bit for bit).
void rotary_row(const uint16_t* x, int heads, int d, const uint16_t* c, const uint16_t* s, uint16_t* out) {
    const int half = d / 2;
    for (int h = 0; h < heads; ++h) {
        const uint16_t* x1 = x + static_cast<int64_t>(h) * d;
        const uint16_t* x2 = x1 + half;
        uint16_t* o1 = out + static_cast<int64_t>(h) * d;
        uint16_t* o2 = o1 + half;
        int j = 0;
#if defined(__AVX512F__)
        for (; j + 16 <= half; j += 16) {
            __m512 a = load_bf(x1 + j), b = load_bf(x2 + j), cv = load_bf(c + j), sv = load_bf(s + j);
            __m512 first = _mm512_sub_ps(to_bf_f(_mm512_mul_ps(a, cv)), to_bf_f(_mm512_mul_ps(b, sv)));
            __m512 second = _mm512_add_ps(to_bf_f(_mm512_mul_ps(b, cv)), to_bf_f(_mm512_mul_ps(a, sv)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o1 + j), to_bf(first));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o2 + j), to_bf(second));
        }
#endif
        for (; j < half; ++j) {
            float a = bf2f(x1[j]), b = bf2f(x2[j]), cj = bf2f(c[j]), sj = bf2f(s[j]);
            o1[j] = f2bf(bf2f(f2bf(a * cj)) - bf2f(f2bf(b * sj)));
            o2[j] = f2bf(bf2f(f2bf(b * cj)) + bf2f(f2bf(a * sj)));
        }
    }
}
}  // namespace

extern "C" {

void lp_rms_norm_bf16(const uint16_t* x, int64_t xs, int rows, int h, const uint16_t* w, float eps, uint16_t* out,
                      int nthreads) {
    if (nthreads <= 1 || rows < 2) {
        for (int i = 0; i < rows; ++i) rms_norm_row(x + i * xs, w, eps, h, out + static_cast<int64_t>(i) * h);
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int i = 0; i < rows; ++i) rms_norm_row(x + i * xs, w, eps, h, out + static_cast<int64_t>(i) * h);
}

void lp_silu_mul_bf16(const uint16_t* gu, int64_t gs, int rows, int n, uint16_t* out, int nthreads) {
    if (nthreads <= 1 || rows < 2) {
        for (int i = 0; i < rows; ++i) silu_mul_row(gu + i * gs, gu + i * gs + n, n, out + static_cast<int64_t>(i) * n);
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int i = 0; i < rows; ++i) silu_mul_row(gu + i * gs, gu + i * gs + n, n, out + static_cast<int64_t>(i) * n);
}

// rotary: x [rows, heads, d] (row stride xs, heads dense), cos/sin [rows, d/2] dense -> out dense.
void lp_rotary_bf16(const uint16_t* x, int64_t xs, int rows, int heads, int d, const uint16_t* cos,
                    const uint16_t* sin, uint16_t* out, int nthreads) {
    const int half = d / 2;
    const int64_t os = static_cast<int64_t>(heads) * d;
    if (nthreads <= 1 || rows < 2) {
        for (int i = 0; i < rows; ++i) rotary_row(x + i * xs, heads, d, cos + i * half, sin + i * half, out + i * os);
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int i = 0; i < rows; ++i) rotary_row(x + i * xs, heads, d, cos + i * half, sin + i * half, out + i * os);
}

// KV write: token t's keys and values (row_bytes each, rows with byte strides ks / vs) to flat
// cache slot slot[t] (caches dense [slots, row_bytes]); a negative slot is padding and skipped. A
// plain copy (any dtype the cache already has): one call instead of torch's mask, index and two
// index_copy_ per layer.
void lp_write_kv(uint8_t* k_cache, uint8_t* v_cache, const uint8_t* k, int64_t ks, const uint8_t* v, int64_t vs,
                 const int64_t* slot, int tokens, int64_t row_bytes) {
    for (int t = 0; t < tokens; ++t) {
        if (slot[t] < 0) continue;
        std::memcpy(k_cache + slot[t] * row_bytes, k + t * ks, row_bytes);
        std::memcpy(v_cache + slot[t] * row_bytes, v + t * vs, row_bytes);
    }
}

}  // extern "C"
