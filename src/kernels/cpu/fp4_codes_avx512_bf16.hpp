// FP4 weights (MXFP4, NVFP4) on AVX-512 with BF16: the FP4 chunk order of the activations, the E2M1 codes'
// bf16 bits, the block scales decoded 32 codes at a time, and MXFP4 rows decoded into bf16 weights with their
// scales (linear_quant_bf16dot.hpp's arithmetic). Shared by the VDPBF16PS kernels and the AMX ones; included
// only by files compiled for AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/packed_weight.hpp"

namespace xmoe::kernels::avx512_bf16 {

// FP4 chunk order: step s's word 2l + h takes element 8·l + 4·h + s of its chunk of 128. VPERMT2W reads 64
// words, so words 0..15 come from elements 0..63 and 16..31 from 64..127 with the same indices mod 64.
struct Fp4Order {
  __m512i step[4];
  Fp4Order() {
    for (int s = 0; s < 4; ++s) {
      alignas(64) uint16_t idx[32];
      for (int l = 0; l < 16; ++l)
        for (int h = 0; h < 2; ++h) idx[2 * l + h] = static_cast<uint16_t>((8 * l + 4 * h + s) % 64);
      step[s] = _mm512_load_si512(idx);
    }
  }
};

// One FP4 x row rounded to bf16 (bf16::from_float), zeros past k, in chunk order: chunk c's step s at
// dst + (c / 32 + s) · step_stride words.
inline void pack_fp4_x_row(const Fp4Order& order, const float* x, int64_t k, int64_t padded, uint16_t* dst,
                           int64_t step_stride) {
  alignas(64) uint16_t plain[128];
  for (int64_t c = 0; c < padded; c += 128) {
    for (int64_t p = 0; p < 128; p += 16) {
      const int64_t rem = std::clamp<int64_t>(k - c - p, 0, 16);
      const __mmask16 mask = rem == 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(plain + p),
                         round_to_bf16(_mm512_maskz_loadu_epi32(mask, x + c + p)));
    }
    const __m512i* src = reinterpret_cast<const __m512i*>(plain);
    for (int s = 0; s < 4; ++s) {
      const __m512i lo =
          _mm512_permutex2var_epi16(_mm512_load_si512(src), order.step[s], _mm512_load_si512(src + 1));
      const __m512i hi =
          _mm512_permutex2var_epi16(_mm512_load_si512(src + 2), order.step[s], _mm512_load_si512(src + 3));
      _mm512_store_si512(dst + (c / 32 + s) * step_stride, _mm512_mask_blend_epi16(0xFFFF0000u, lo, hi));
    }
  }
}

// The E2M1 values' bf16 bits, twice (index bit 4 is the next nibble's low bit).
inline __m512i e2m1_bf16_table() {
  return _mm512_set_epi16(static_cast<short>(0xC0C0), static_cast<short>(0xC080), static_cast<short>(0xC040),
                          static_cast<short>(0xC000), static_cast<short>(0xBFC0), static_cast<short>(0xBF80),
                          static_cast<short>(0xBF00), static_cast<short>(0x8000), 0x40C0, 0x4080, 0x4040,
                          0x4000, 0x3FC0, 0x3F80, 0x3F00, 0x0000, static_cast<short>(0xC0C0),
                          static_cast<short>(0xC080), static_cast<short>(0xC040), static_cast<short>(0xC000),
                          static_cast<short>(0xBFC0), static_cast<short>(0xBF80), static_cast<short>(0xBF00),
                          static_cast<short>(0x8000), 0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00,
                          0x0000);
}

// FP4 block multipliers, decoded once per group of chunks: one load of 32 scale codes per row (NVFP4: 4
// chunks, MXFP4: 8), widened to words and shifted so that a code's word, put into the high half of a dword,
// is the multiplier's f32 bits; each chunk then takes its lanes' codes with one masked VPERMW (lane l of a
// chunk reads code l / 2 for NVFP4, l / 4 for MXFP4). Per chunk and row this is one permute (NVFP4: and one
// multiply) instead of a load, broadcast, shuffle, shifts and guard updates.
//  * NVFP4: code << 4 in the high word is the E4M3 value × 2^-120 (an f32 subnormal for E4M3 subnormals)
//    for codes 0..0x7E; times the global scale × 2^120 it is the reference's product where that is exact
//    (checked by the caller). Negative scale codes and NaN (0x7F, 0xFF) are left to the reference: a
//    running max of the codes.
//  * MXFP4: code << 7 minus 127 << 7 is the exponent change (code - 127) in bf16 position, which added to a
//    nonzero E2M1 value's bf16 bits gives value · 2^(code - 127) exactly while the exponent stays normal:
//    codes 2..252; a running min and max leave the others to the reference.
// MXFP4's fast paths take scale codes 127 ± this (multipliers 2^-32 .. 2^32) and activations whose bf16 is
// zero or within 2^±64: then every product and partial sum, scaled by the accumulators' powers of two or
// not, stays in f32's normal range (a product has at most 10 significant bits, so a nonzero partial sum is
// at least 2^-106), and the scaled-domain chains give the reference's bits. Anything else runs the reference.
constexpr int kMxfp4ScaleReach = 32;

template <bool NV>
struct Fp4Scales {
  static constexpr int64_t kBlock = NV ? 16 : 32;
  static constexpr int kCodesPerChunk = static_cast<int>(128 / kBlock);
  static constexpr int kGroupChunks = 32 / kCodesPerChunk;
  __m512 global;  // NVFP4's global scale × 2^120
  __m256i lo = _mm256_set1_epi8(-1), hi = _mm256_setzero_si256();
  // Word index of chunk 0's lanes (high words; the low words are zeroed): lane l reads code
  // l · kCodesPerChunk / 16.
  static __m512i first_index() {
    alignas(64) uint16_t idx[32];
    for (int l = 0; l < 16; ++l) {
      idx[2 * l] = 0;
      idx[2 * l + 1] = static_cast<uint16_t>(l * kCodesPerChunk / 16);
    }
    return _mm512_load_si512(idx);
  }
  // Both words of lane l read code l · kCodesPerChunk / 16 (MXFP4's per-lane exponent change).
  static __m512i full_first_index() {
    alignas(64) uint16_t idx[32];
    for (int w = 0; w < 32; ++w) idx[w] = static_cast<uint16_t>(w / 2 * kCodesPerChunk / 16);
    return _mm512_load_si512(idx);
  }
  static __m512i next_index(__m512i index) {
    return _mm512_add_epi16(index, _mm512_set1_epi16(kCodesPerChunk));
  }
  // Up to 32 codes from p (`count` left in the row; bytes past them are made codes that pass the guard,
  // and their lanes are masked off) as words in multiplier position.
  __m512i words(const uint8_t* p, int64_t count) {
    const __mmask32 m = count >= 32 ? ~__mmask32(0) : (__mmask32(1) << count) - 1;
    const __m256i q =
        NV ? _mm256_maskz_loadu_epi8(m, p) : _mm256_mask_loadu_epi8(_mm256_set1_epi8(127), m, p);
    hi = _mm256_max_epu8(hi, q);
    if constexpr (!NV) lo = _mm256_min_epu8(lo, q);
    return _mm512_slli_epi16(_mm512_cvtepu8_epi16(q), NV ? 4 : 7);
  }
  // MXFP4: word w of (previous, words) -> slot w - kCodesPerChunk, from the previous group below 0.
  static __m512i previous_slot_index() {
    alignas(64) uint16_t idx[32];
    for (int w = 0; w < 32; ++w)
      idx[w] = static_cast<uint16_t>(w >= kCodesPerChunk ? 32 + w - kCodesPerChunk : 32 - kCodesPerChunk + w);
    return _mm512_load_si512(idx);
  }
  // MXFP4: each lane's multiplier 2^(code - 127) as f32 bits (index from first_index()).
  static __m512i multiplier_bits(__m512i words, __m512i index) {
    return _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, index, words);
  }
  // MXFP4: the exponent change of each lane of a chunk (words from words(), index from full_first_index()).
  static __m512i exponent_change(__m512i words, __m512i full_index) {
    return _mm512_sub_epi16(_mm512_permutexvar_epi16(full_index, words), _mm512_set1_epi16(127 << 7));
  }
  // E2M1 bf16 bits times 2^(code - 127): the exponent change added to the nonzero values.
  static __m512bh scaled(__m512i value, __m512i change) {
    const __mmask32 nonzero = _mm512_test_epi16_mask(value, _mm512_set1_epi16(0x7FFF));
    return (__m512bh)_mm512_mask_add_epi16(value, nonzero, value, change);
  }
  // NVFP4: the chunk's lanes' multipliers (index from first_index()).
  __m512 chunk(__m512i words, __m512i index) const {
    static_assert(NV, "MXFP4 scales the codes instead (exponent_change, scaled)");
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, index, words)),
                         global);
  }
  // Whether the fast path may keep its result: NVFP4 met no negative or NaN scale; MXFP4 met only codes in
  // [low, high] (the register path's scaled domain: 127 ± kMxfp4ScaleReach; the decoded panels: 2..252).
  bool clean(int low = 127 - kMxfp4ScaleReach, int high = 127 + kMxfp4ScaleReach) const {
    if constexpr (NV) return _mm256_cmpgt_epu8_mask(hi, _mm256_set1_epi8(0x7E)) == 0;
    return _mm256_cmpgt_epu8_mask(hi, _mm256_set1_epi8(static_cast<char>(high))) == 0 &&
           _mm256_cmplt_epu8_mask(lo, _mm256_set1_epi8(static_cast<char>(low))) == 0;
  }
};

// One 128-code MXFP4 chunk (raw: its 64 bytes) as bf16 weights, E2M1 value · 2^(code - 127) exact, in chunk
// order at out (4 steps of 32 words); change: each lane's exponent change (Fp4Scales::exponent_change).
inline void store_mxfp4_chunk(__m512i raw, __m512i change, __m512i table, uint16_t* out) {
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s)
    _mm512_store_si512(out + 32 * s,
                       (__m512i)Fp4Scales<false>::scaled(
                           _mm512_permutexvar_epi16(
                               s == 0 ? raw : _mm512_srli_epi16(raw, static_cast<unsigned>(4 * s)), table),
                           change));
}

// MXFP4 rows [n, n + rows) as bf16 weights in chunk order, row j at panel + j · ldp (ldp: k padded to 128;
// the last chunk whole, codes past k read as zeros); false when a scale code outside 2..252 was met.
inline bool mxfp4_decode_rows(const PackedWeight& w, int64_t n, int64_t rows, uint16_t* panel, int64_t ldp) {
  using Scales = Fp4Scales<false>;
  constexpr int64_t kGroup = 128 * Scales::kGroupChunks;
  const int64_t k = w.cols;
  const __m512i table = e2m1_bf16_table();
  Scales scales{_mm512_setzero_ps()};
  for (int64_t j = 0; j < rows; ++j) {
    const auto* row = reinterpret_cast<const uint8_t*>(w.data) + (n + j) * w.row_bytes;
    const auto* codes = reinterpret_cast<const uint8_t*>(w.scales) + (n + j) * w.scale_row_stride;
    __m512i words = _mm512_setzero_si512(), index = Scales::full_first_index();
    for (int64_t c = 0; c < k; c += 128, index = Scales::next_index(index)) {
      const int64_t left = k - c;
      if (c % kGroup == 0) {  // the next 32 scale codes, as fp4_tile takes them
        words = scales.words(codes + c / Scales::kBlock, left / Scales::kBlock);
        index = Scales::full_first_index();
      }
      const __m512i raw = left >= 128 ? _mm512_loadu_si512(row + c / 2)
                                      : _mm512_maskz_loadu_epi8(byte_mask(left / 2), row + c / 2);
      store_mxfp4_chunk(raw, Scales::exponent_change(words, index), table, panel + j * ldp + c);
    }
  }
  return scales.clean(2, 252);
}

// MXFP4 rows [n, n + rows) (at most kMaxRows) decoded as mxfp4_decode_rows decodes them, a few chunks per
// call and rows inside chunks: the AMX decode shape walks a block of 16 rows through k a group of chunks at a
// time, and decoding each call's columns row by row cost it a fresh load of the row's 32 scale codes every
// call and the chunk's lane index per row. Here each row's scale words live across calls (read once per 1024
// columns) and a chunk's index serves all rows: the same bits, and one x row's MXFP4 linear from cache ran
// 1.15-1.8× as fast (`xmoe linear-bench --threads 1 --clock thread --matmul-precision medium --isa amx`).
class Mxfp4RowBlockDecoder {
 public:
  static constexpr int64_t kMaxRows = 16;
  Mxfp4RowBlockDecoder(const PackedWeight& w, int64_t n, int64_t rows)
      : w_(w),
        rows_(rows),
        data_(reinterpret_cast<const uint8_t*>(w.data) + n * w.row_bytes),
        codes_(reinterpret_cast<const uint8_t*>(w.scales) + n * w.scale_row_stride) {}
  // Columns [c0, c1) (c0 a multiple of 128; the last chunk whole, codes past k read as zeros) of row j at
  // panel + j · ldp + (c - c0).
  void decode(uint16_t* panel, int64_t ldp, int64_t c0, int64_t c1) {
    constexpr int64_t kGroup = 128 * Scales::kGroupChunks;
    const int64_t k = w_.cols, end = std::min(k, c1);
    const __m512i table = e2m1_bf16_table();
    for (int64_t c = c0; c < end; c += 128) {
      if (c / kGroup != group_) {
        group_ = c / kGroup;
        const int64_t g = group_ * kGroup;
        for (int64_t j = 0; j < rows_; ++j)
          words_[j] =
              scales_.words(codes_ + j * w_.scale_row_stride + g / Scales::kBlock, (k - g) / Scales::kBlock);
      }
      const __m512i index =
          _mm512_add_epi16(Scales::full_first_index(),
                           _mm512_set1_epi16(static_cast<short>(c % kGroup / 128 * Scales::kCodesPerChunk)));
      const int64_t left = k - c;
      const __mmask64 bytes = left >= 128 ? ~__mmask64(0) : byte_mask(left / 2);
      uint16_t* out = panel + (c - c0);
      for (int64_t j = 0; j < rows_; ++j)
        store_mxfp4_chunk(_mm512_maskz_loadu_epi8(bytes, data_ + j * w_.row_bytes + c / 2),
                          Scales::exponent_change(words_[j], index), table, out + j * ldp);
    }
  }
  // False when a scale code outside 2..252 was met (the exponent change does not reproduce it).
  bool clean() const { return scales_.clean(2, 252); }

 private:
  using Scales = Fp4Scales<false>;
  const PackedWeight& w_;
  int64_t rows_;
  const uint8_t* data_;
  const uint8_t* codes_;
  Scales scales_{_mm512_setzero_ps()};
  int64_t group_ = -1;  // the group of 8 chunks whose scale words are in words_
  __m512i words_[kMaxRows];
};

}  // namespace xmoe::kernels::avx512_bf16
