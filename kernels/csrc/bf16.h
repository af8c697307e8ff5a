// bf16 <-> float32 exactly as torch converts: widening is a 16-bit shift (exact); narrowing rounds to
// nearest even and keeps a NaN a (quiet) NaN. One definition for every kernel file, so that every
// kernel rounds where torch rounds and the oracles compare bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace lp_bf16 {

inline float bf2f(uint16_t v) {
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f2bf(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(u >> 16);
}

}  // namespace lp_bf16
