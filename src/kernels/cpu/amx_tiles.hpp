// AMX tile instructions with the tile register as a template constant (GCC's intrinsics take it only as a
// literal token), and the tile configuration the BF16 kernels use. Inline assembly, so a file needs no AMX
// compiler flags to include it; callers run it only where the CPU has AMX and the OS granted the tiles
// (CpuFeatures::has_amx_bf16).
#pragma once
#include <cstdint>
#include <utility>

namespace xmoe::kernels::amx {

// ldtilecfg's 64-byte operand (palette 1): bytes per row and rows of each of the 8 tile registers.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Every register 16 rows × 64 bytes: a 16 × 16 f32 accumulator, 16 rows of 32 bf16, or 16 rows of 16 bf16
// pairs.
inline TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}

inline void load_config(const TileConfig& c) {
  asm volatile("ldtilecfg %0" ::"m"(c));
}
inline void release() {
  asm volatile("tilerelease" ::: "memory");
}
template <int T>
inline void zero() {
  asm volatile("tilezero %%tmm%c0" ::"i"(T));
}
// 16 rows of 64 bytes, `stride` bytes apart.
template <int T>
inline void load(const void* base, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
template <int T>
inline void store(void* base, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
}
// C += A · B over bf16 pairs (TDPBF16PS; linear_bf16tile.hpp gives its arithmetic).
template <int C, int A, int B>
inline void dpbf16() {
  asm volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A), "i"(C));
}

// f(integral_constant<int, I>) for I = 0..N-1: tile registers are template constants, so loops over them
// unroll at compile time.
template <int N, class F>
inline void static_for(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

}  // namespace xmoe::kernels::amx
