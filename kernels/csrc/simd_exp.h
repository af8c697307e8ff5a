// exp(x) for 16 fp32 lanes (AVX-512), ~1 ulp: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2] (Cephes'
// polynomial). Inputs are clamped where the result is 0 or inf anyway (scalef makes the inf and the
// subnormals); -inf gives 0 (a masked-out attention score). Shared by the element-wise SiLU and the
// decode attention's softmax.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace lp_simd {

inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(100.0f));
    const __m512 n =
        _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);  // p * 2^n, with the underflow to 0 / overflow to inf handled
}

}  // namespace lp_simd
#endif
