// Throughput of the AVX-512 instruction forms the decode kernels are built from, alone and in pairs, in
// core cycles (a chain of dependent scalar adds measures the clock in the same run). A pair that costs the
// sum of its parts shares the pipes; one that costs the larger part does not. The notes derive the
// quantized decode kernels' arithmetic ceilings from it: instructions per 16 weights over the pipes they
// may use. One thread, any CPU with AVX-512BW and AVX512-BF16, about 5 s:
//   g++ -O2 -std=c++20 -mavx512f -mavx512bw -mavx512bf16 -mavx512vl tools/vector_pipes.cpp -o /tmp/vp
//   /tmp/vp
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

volatile int opaque_zero = 0;

// x with a lane changed by an amount the compiler cannot know, so chains never fold together.
__m512i opaque(__m512i x, int i) {
  alignas(64) int v[16];
  _mm512_store_si512(v, x);
  v[0] += opaque_zero * i;
  return _mm512_load_si512(v);
}

const __m512 kB = _mm512_set1_ps(1.0001f), kC = _mm512_set1_ps(0.999f);
const __m512i kIdx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

#define PS(x) _mm512_castsi512_ps(x)
#define SI(x) _mm512_castps_si512(x)
#define FORMS(X)                                                            \
  X(vfmadd231ps, SI(_mm512_fmadd_ps(PS(x), kB, kC)))                        \
  X(vmulps, SI(_mm512_mul_ps(PS(x), kB)))                                   \
  X(vaddps, SI(_mm512_add_ps(PS(x), kB)))                                   \
  X(vdpbf16ps, SI(_mm512_dpbf16_ps(PS(x), (__m512bh)kIdx, (__m512bh)kIdx))) \
  X(vpermps, SI(_mm512_maskz_permutexvar_ps(0xffff, kIdx, PS(x))))          \
  X(vpermw, _mm512_maskz_permutexvar_epi16(~0u, x, kIdx))                   \
  X(vpshufb, _mm512_shuffle_epi8(x, kIdx))                                  \
  X(vpunpcklwd, _mm512_unpacklo_epi16(x, kIdx))                             \
  X(vpsrlvd, _mm512_maskz_srlv_epi32(0xffff, x, kIdx))                      \
  X(vpsrld, _mm512_maskz_srli_epi32(0xffff, x, 3))                          \
  X(vpsraw, _mm512_srai_epi16(x, 3))                                        \
  X(vpandd, _mm512_and_si512(x, kIdx))                                      \
  X(vcvtdq2ps, SI(_mm512_maskz_cvtepi32_ps(0xffff, x)))

#define DEFINE(name, expr)         \
  inline __m512i name(__m512i x) { \
    return expr;                   \
  }
FORMS(DEFINE)

// Seconds for n iterations of 8 independent chains of A interleaved with 8 of B.
template <__m512i (*A)(__m512i), __m512i (*B)(__m512i)>
double pair_seconds(long n) {
  __m512i a0 = opaque(kIdx, 0), a1 = opaque(kIdx, 1), a2 = opaque(kIdx, 2), a3 = opaque(kIdx, 3);
  __m512i a4 = opaque(kIdx, 4), a5 = opaque(kIdx, 5), a6 = opaque(kIdx, 6), a7 = opaque(kIdx, 7);
  __m512i b0 = opaque(kIdx, 8), b1 = opaque(kIdx, 9), b2 = opaque(kIdx, 10), b3 = opaque(kIdx, 11);
  __m512i b4 = opaque(kIdx, 12), b5 = opaque(kIdx, 13), b6 = opaque(kIdx, 14), b7 = opaque(kIdx, 15);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < n; ++it) {
    a0 = A(a0), b0 = B(b0), a1 = A(a1), b1 = B(b1), a2 = A(a2), b2 = B(b2), a3 = A(a3), b3 = B(b3);
    a4 = A(a4), b4 = B(b4), a5 = A(a5), b5 = B(b5), a6 = A(a6), b6 = B(b6), a7 = A(a7), b7 = B(b7);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    __asm__ volatile("" : "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3), "+v"(b4), "+v"(b5), "+v"(b6), "+v"(b7));
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

// Cycles per second: a chain of dependent scalar adds, one cycle each.
double clock_hz(long n) {
  uint64_t x = static_cast<uint64_t>(opaque_zero), one = 1 + static_cast<uint64_t>(opaque_zero);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < n; ++it)
    __asm__ volatile(
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
        : "+r"(x)
        : "r"(one));
  const auto t1 = std::chrono::steady_clock::now();
  opaque_zero = static_cast<int>(x == 0);
  return 8.0 * static_cast<double>(n) / std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512bf16")) {
    std::fprintf(stderr, "vector_pipes: needs AVX-512BW and AVX512-BF16\n");
    return 1;
  }
  constexpr long kIters = 20'000'000;
  clock_hz(kIters);  // warm the core up to its clock
  const double hz = clock_hz(kIters);
  std::printf("clock (dependent scalar adds): %.2f GHz\n", hz / 1e9);
  std::printf("alone: cycles per zmm instruction (8 independent chains)\n");
#define ALONE(name, expr) \
  std::printf("  %-11s %.2f\n", #name, pair_seconds<name, name>(kIters) * hz / (16.0 * kIters));
  FORMS(ALONE)
  std::printf("pairs: cycles per (A + B); the sum of the two alone = one pipe set, the larger = disjoint\n");
#define PAIR(a, b) \
  std::printf("  %-11s + %-11s %.2f\n", #a, #b, pair_seconds<a, b>(kIters) * hz / (8.0 * kIters));
  PAIR(vfmadd231ps, vmulps)
  PAIR(vfmadd231ps, vpermps)
  PAIR(vfmadd231ps, vpsrlvd)
  PAIR(vfmadd231ps, vpshufb)
  PAIR(vfmadd231ps, vcvtdq2ps)
  PAIR(vfmadd231ps, vpandd)
  PAIR(vpermps, vpsrlvd)
  PAIR(vpermps, vpshufb)
  PAIR(vpermps, vpandd)
  PAIR(vpsrlvd, vaddps)
  PAIR(vpsrlvd, vcvtdq2ps)
  PAIR(vdpbf16ps, vpermw)
  PAIR(vdpbf16ps, vpsraw)
  PAIR(vdpbf16ps, vfmadd231ps)
  return 0;
}
