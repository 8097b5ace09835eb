// AVX2 linears over block-quantized weights, bit-identical to linear_quant_reference.cpp (the order is
// described in linear_quant.hpp). The 16 lanes of the shared order are two 8-lane halves (lanes 0–7 and
// 8–15); weights are decoded 16 at a time in registers with their block multiplier folded in.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/codecs.hpp"

namespace xmoe::kernels::avx2 {
namespace {

struct V16 {
  __m256 lo, hi;
};

// reduce_lanes in registers: halves (l + 8), then l + 4, l + 2, l + 1.
inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Lanes [0, left) of a 16-lane step as two 8-lane masks (all ones when left ≥ 16).
struct TailMask {
  __m256i lo, hi;
  bool full;
  explicit TailMask(int64_t left) : full(left >= 16) {
    const __m256i n = _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 16)));
    lo = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    hi = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
  }
};

inline V16 load_x(const float* x, const TailMask& m) {
  if (m.full) return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
  return {_mm256_maskload_ps(x, m.lo), _mm256_maskload_ps(x + 8, m.hi)};
}

// Block multipliers as f32 per 16 columns; E8M0 / E4M3 codes through a per-call table built by
// quant::fill_scale_table (the reference's expression, so the products are the same bits; compiled at the
// baseline level, so no inline decoder is emitted here with this file's flags).
struct Scales {
  const PackedWeight* w;
  float table[256];
  explicit Scales(const PackedWeight& pw) : w(&pw) {
    if (pw.scale_type != ScaleType::f32) quant::fill_scale_table(pw, table);
  }
  // Scales are looked up by (row base + block counter): no division in the inner loops.
  int64_t row_base(int64_t n) const { return (n / w->block_rows) * w->scale_row_stride; }
  int steps_per_block() const { return w->block_cols / 16; }
  // The scales of rows [b, e) into L2 (a few bytes per row block, but a stream of its own).
  void prefetch(int64_t b, int64_t e) const {
    if (b >= e) return;
    const int64_t size = w->scale_type == ScaleType::f32 ? 4 : 1;
    const char* p = reinterpret_cast<const char*>(w->scales) + row_base(b) * size;
    const int64_t bytes = (row_base(e - 1) + w->scale_row_stride) * size - row_base(b) * size;
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
  }
  float get(int64_t index) const {
    if (w->scale_type == ScaleType::f32) {
      float s;
      std::memcpy(&s, w->scales + 4 * index, 4);
      return s;
    }
    return table[static_cast<uint8_t>(w->scales[index])];
  }
};

// E4M3 codes (one per lane) → f32 by integer operations (independent of denormals-are-zero).
inline __m256 e4m3_to_ps(__m256i v) {
  const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.0f / 512));
  __m256 f = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub,
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
  f = _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                       _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
  return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

struct Fp8Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp8Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  V16 load(int64_t n, int64_t p, float scale, int64_t k, const TailMask& m) const {
    const uint8_t* src = data + n * row_bytes + p;
    __m128i bytes;
    if (m.full) {
      bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    } else {
      alignas(16) uint8_t buf[16] = {};
      std::memcpy(buf, src, static_cast<size_t>(k - p));
      bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    const __m256 s = _mm256_set1_ps(scale);
    V16 w{_mm256_mul_ps(e4m3_to_ps(_mm256_cvtepu8_epi32(bytes)), s),
          _mm256_mul_ps(e4m3_to_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))), s)};
    if (!m.full) {  // past k the weight is 0 (not 0 · scale, which is NaN for an infinite scale)
      w.lo = _mm256_and_ps(w.lo, _mm256_castsi256_ps(m.lo));
      w.hi = _mm256_and_ps(w.hi, _mm256_castsi256_ps(m.hi));
    }
    return w;
  }
};

// 16 E2M1 codes from 8 bytes (element 2j in the low nibble of byte j): magnitude through an 8-entry table,
// the sign bit moved to bit 31.
struct Fp4Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp4Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  static __m256 decode(__m256i codes) {
    const __m256 lut = _mm256_loadu_ps(quant::kE2M1Values.data());
    const __m256 mag = _mm256_permutevar8x32_ps(lut, _mm256_and_si256(codes, _mm256_set1_epi32(7)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
  }
  V16 load(int64_t n, int64_t p, float scale, int64_t, const TailMask&) const {  // k is a multiple of 16
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + n * row_bytes + p / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m128i nib = _mm_unpacklo_epi8(lo, hi);
    const __m256 s = _mm256_set1_ps(scale);
    return {_mm256_mul_ps(decode(_mm256_cvtepu8_epi32(nib)), s),
            _mm256_mul_ps(decode(_mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8))), s)};
  }
};

struct F32Rows {
  const float* data;
  int64_t ld, first_row;
  struct NoScales {
    int64_t row_base(int64_t) const { return 0; }
    int steps_per_block() const { return 1 << 30; }
    float get(int64_t) const { return 1.0f; }
  } scales;
  V16 load(int64_t n, int64_t p, float, int64_t, const TailMask& m) const {
    return load_x(data + (n - first_row) * ld + p, m);
  }
};

// MR x rows × NR weight rows starting at n: each step decodes a weight row's 16 values once and feeds them to
// all MR rows (x re-read from L1), which keeps the live registers within AVX2's sixteen.
template <int MR, int NR, class Rows>
void tile(const Rows& w, int64_t n, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
          const char* next = nullptr, int64_t next_bytes = 0) {
  // `next`: the bytes of the tile after this one, prefetched into L2 evenly over this tile's steps (the
  // hardware prefetchers stop at 4 KiB pages, and each of NR short rows would restart cold).
  const int64_t prefetch_step = (next_bytes / ((k + 15) / 16) + 64) / 64 * 64;
  int64_t prefetched = 0;
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  int64_t base[NR];
  for (int j = 0; j < NR; ++j) base[j] = w.scales.row_base(n + j);
  const int steps_per_block = w.scales.steps_per_block();
  int64_t block = 0;
  int step = 0;
  for (int64_t p = 0; p < k; p += 16) {
    for (const int64_t end = std::min(next_bytes, prefetched + prefetch_step); prefetched < end;
         prefetched += 64)
      _mm_prefetch(next + prefetched, _MM_HINT_T1);
    const TailMask mask(k - p);
    const int64_t this_block = block;
    if (++step == steps_per_block) {
      step = 0;
      ++block;
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const V16 wv = w.load(n + j, p, w.scales.get(base[j] + this_block), k, mask);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const V16 xv = load_x(x + i * ldx + p, mask);
        lo[i][j] = _mm256_fmadd_ps(xv.lo, wv.lo, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xv.hi, wv.hi, hi[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce16(lo[i][j], hi[i][j]);
}

template <int MR, int NR, class Rows>
void stream_rows(const Rows& w, const LinearArgs& a) {
  const int64_t k = a.w->cols;
  const auto rows_bytes = [&](int64_t b, int64_t e) { return (e - b) * w.row_bytes; };
  const auto row_ptr = [&](int64_t r) { return reinterpret_cast<const char*>(w.data + r * w.row_bytes); };
  for (int64_t b = 0; b < rows_bytes(a.n0, std::min(a.n1, a.n0 + NR)); b += 64)
    _mm_prefetch(row_ptr(a.n0) + b, _MM_HINT_T1);
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    const int64_t next_end = std::min(a.n1, n + 2 * NR);
    w.prefetch_scales(n + NR, next_end);
    tile<MR, NR>(w, n, k, a.x, a.ldx, a.y, a.ldy, row_ptr(n + NR), rows_bytes(n + NR, next_end));
  }
  for (; n < a.n1; ++n) tile<MR, 1>(w, n, k, a.x, a.ldx, a.y, a.ldy);
}

// Many rows: a panel of weight rows dequantised once into f32, then 2 × 2 register tiles over it.
template <class Rows>
void panel_gemm(const Rows& w, const LinearArgs& a) {
  constexpr int64_t kPanel = 16;
  const int64_t k = a.w->cols, ld = (k + 15) / 16 * 16;
  std::vector<float> panel(static_cast<size_t>(kPanel * ld));
  for (int64_t n0 = a.n0; n0 < a.n1; n0 += kPanel) {
    const int64_t n1 = std::min(a.n1, n0 + kPanel);
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t p = 0; p < k; p += 16) {
        const float scale = w.scales.get(w.scales.row_base(n) + p / 16 / w.scales.steps_per_block());
        const V16 v = w.load(n, p, scale, k, TailMask(k - p));
        float* dst = panel.data() + (n - n0) * ld + p;
        _mm256_storeu_ps(dst, v.lo);
        _mm256_storeu_ps(dst + 8, v.hi);
      }
    const F32Rows f{panel.data(), ld, n0, {}};
    for (int64_t i = 0; i < a.m; i += 2) {
      const float* x = a.x + i * a.ldx;
      float* y = a.y + i * a.ldy;
      int64_t n = n0;
      if (i + 2 <= a.m) {
        for (; n + 2 <= n1; n += 2) tile<2, 2>(f, n, k, x, a.ldx, y, a.ldy);
        for (; n < n1; ++n) tile<2, 1>(f, n, k, x, a.ldx, y, a.ldy);
      } else {
        for (; n + 2 <= n1; n += 2) tile<1, 2>(f, n, k, x, a.ldx, y, a.ldy);
        for (; n < n1; ++n) tile<1, 1>(f, n, k, x, a.ldx, y, a.ldy);
      }
    }
  }
}

template <class Rows>
void linear(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Rows w(*a.w);
  switch (a.m) {
    case 1:
      return stream_rows<1, 4>(w, a);
    case 2:
      return stream_rows<2, 2>(w, a);
    case 3:
      return stream_rows<3, 1>(w, a);
    default:
      return panel_gemm(w, a);
  }
}

}  // namespace

void linear_fp8_block(const LinearArgs& args) {
  linear<Fp8Rows>(args, WeightFormat::fp8_block);
}
void linear_mxfp4(const LinearArgs& args) {
  linear<Fp4Rows>(args, WeightFormat::mxfp4);
}
void linear_nvfp4(const LinearArgs& args) {
  linear<Fp4Rows>(args, WeightFormat::nvfp4);
}

}  // namespace xmoe::kernels::avx2
