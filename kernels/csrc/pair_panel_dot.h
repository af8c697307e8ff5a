// The inner product over "pair panels" (kernels/pair_panels.py: bf16 [n / 16, k / 2, 16, 2], one
// 64-byte register = 16 output columns x 2 consecutive k), shared by the bf16 linear layers
// (cpu_linear_bf16.cpp) and the whole-prompt attention (cpu_prompt_attention.cpp): R rows of x
// times NP panels into R x NP fp32 accumulators, one vdpbf16ps per (row, panel, k pair), in k
// order. NP panels' weights stay in registers while every row's broadcast pair meets them.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LP_DP_BF16 1
#endif

namespace lp_pair {

constexpr int kPanel = 16;      // output columns per panel: one register of fp32 accumulators
constexpr int kPairElems = 32;  // bf16 per (panel, k pair): one 64-byte register of weights
constexpr int kPrefetch = 512;  // bf16 ahead in a panel's stream (1 KB: 16 k pairs)

#if defined(LP_DP_BF16)
inline __m512i broadcast_pair(const uint16_t* x) {
    int32_t v;
    std::memcpy(&v, x, sizeof v);
    return _mm512_set1_epi32(v);
}

// acc[r][j] = sum over k pairs of row r of x (row stride xs) and panel j (panels panel_elems apart).
template <int R, int NP>
inline void dot(__m512 (&acc)[R][NP], const uint16_t* x, int64_t xs, int k2, const uint16_t* w,
                int64_t panel_elems) {
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int kk = 0; kk < k2; ++kk) {
        __m512bh b[NP];
        for (int j = 0; j < NP; ++j) {
            const uint16_t* wj = w + j * panel_elems + static_cast<int64_t>(kk) * kPairElems;
            b[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wj));
            _mm_prefetch(reinterpret_cast<const char*>(wj + kPrefetch), _MM_HINT_T0);
        }
        for (int r = 0; r < R; ++r) {
            const __m512bh xb = reinterpret_cast<__m512bh>(broadcast_pair(x + r * xs + 2 * kk));
            for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xb, b[j]);
        }
    }
}
#endif

}  // namespace lp_pair
