// The AMX level's `medium` linear for MXFP4 weights (linear_quant_bf16tile.hpp's arithmetic, bit for bit the
// scalar reference's for every m, column block and thread). Weight rows are decoded into bf16 with their
// E8M0 scales by fp4_codes_avx512_bf16.hpp's exponent change before they are tile operands; the activations
// are rounded to bf16 once per call, in the FP4 chunk order.
//  * Up to kDecodeRows x rows: yᵀ = W · xᵀ. Each 16 weight rows are decoded kGroupChunks chunks at a time
//    into A tiles in an L1 ring, a group ahead of their tile loads (decode_shape), against x tiles as narrow
//    as the rows.
//  * More rows: y = x · Wᵀ, 128 weight rows at a time decoded (rows padded by a line, so a tile's 16 rows do
//    not share an L1 set) and transposed into B tiles, the packed x rows as A tiles: 2 × 2 tiles over 32 x
//    rows × 32 outputs.
// Scale codes outside 2..252 (which the exponent change does not reproduce) send their tile or block to the
// reference.
// NVFP4 keeps the AVX512-BF16 level's kernel: on tiles its block scales must go into the weights (an E4M3
// multiplier is no power of two and applies to 16 columns of one row, so neither the activations nor a
// tile's partial sums can take it), and that decode (E2M1 and E4M3 to f32, the product rounded to bf16) made
// decode slower at every batch size on Sapphire Rapids: the 8-layer Qwen3-30B-A3B shape at batch 1 / 8 / 16
// ran 15.2 / 42.1 / 56.1 tok/s against VDPBF16PS's 22.9 / 59.3 / 70.1 (its 512-token prefill 577 against 157
// tok/s). It is in the history (commit b28bc8e6), with its reference and tests.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/fp4_codes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/cpu/linear_tiles_amx.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::amx {
namespace {

constexpr int64_t kDecodeRows = kMxfp4TileDecodeRows;
constexpr int64_t kGroupChunks = 2;     // decode: chunks of 128 columns decoded together
constexpr int64_t kAheadGroups = 1;     // decode: groups decoded ahead of the tile products
constexpr int64_t kPrefetchGroups = 4;  // decode: groups of each row prefetched ahead
constexpr int64_t kRowGroup = 32;       // prefill: x rows per group of A tiles
constexpr int64_t kPanelRows = 128;     // prefill: weight rows decoded at a time

struct Mxfp4TileCall {
  const LinearArgs& a;
  int64_t k, padded, steps;
  int64_t ld;  // words between rows of the packed x and of the decoded weights

  explicit Mxfp4TileCall(const LinearArgs& args)
      : a(args),
        k(args.w->cols),
        padded((k + kFp4Bf16DotChunk - 1) / kFp4Bf16DotChunk * kFp4Bf16DotChunk),
        steps(padded / kBf16TileStep),
        ld(padded + 32) {}

  // Decode shape: every 16 weight rows against the x B tiles (tile registers as the caller configured them).
  // Rows are decoded kGroupChunks chunks at a time into a ring of kAheadGroups + 1 slots (A tiles of 16 rows
  // kGroupChunks · 256 bytes apart) that stays in L1, a group kAheadGroups before its tiles are loaded (a
  // tile load waits for the older stores to its lines); the rows' lines kPrefetchGroups groups on are
  // prefetched, past a tile's end the next tile's.
  void decode_shape(const uint32_t* xb, uint16_t* ring, float* acc) const {
    constexpr int64_t kGroupWords = kGroupChunks * kFp4Bf16DotChunk, kSlot = kTile * kGroupWords;
    const int64_t groups = (padded + kGroupWords - 1) / kGroupWords, rb = a.w->row_bytes;
    for (int64_t n = a.n0; n < a.n1; n += kTile) {
      const int64_t rows = std::min(kTile, a.n1 - n);
      const auto* base = reinterpret_cast<const uint8_t*>(a.w->data) + n * rb;
      const bool next = n + kTile + rows <= a.w->rows;
      avx512_bf16::Mxfp4RowBlockDecoder decoder(*a.w, n, rows);
      zero<kDecodeC>();
      for (int64_t u = 0; u < groups + kAheadGroups; ++u) {
        if (u < groups) {
          const int64_t c0 = u * kGroupWords, pb = (c0 + kPrefetchGroups * kGroupWords) / 2;
          const uint8_t* ahead = pb < rb ? base + pb : next ? base + kTile * rb + (pb - padded / 2) : nullptr;
          if (ahead != nullptr)
            for (int64_t j = 0; j < rows; ++j)
              for (int64_t line = 0; line < kGroupChunks; ++line)
                _mm_prefetch(reinterpret_cast<const char*>(ahead + j * rb + 64 * line), _MM_HINT_T0);
          decoder.decode(ring + u % (kAheadGroups + 1) * kSlot, kGroupWords, c0,
                         std::min(padded, c0 + kGroupWords));
        }
        if (u < kAheadGroups) continue;
        const int64_t v = u - kAheadGroups, s0 = v * kGroupWords / 32,
                      s1 = std::min(steps, s0 + kGroupWords / 32);
        const uint16_t* slot = ring + v % (kAheadGroups + 1) * kSlot;
        for (int64_t s = s0; s < s1; s += 2)
          static_for<2>([&](auto parity) {
            constexpr int S = decltype(parity)::value;
            decode_product<S>(slot + (s - s0 + S) * 32, kGroupWords * 2, xb + (s + S) * 16 * a.m, a.m);
          });
      }
      if (!decoder.clean()) {
        quant::reference_part(a, reference::linear_mxfp4_medium_tile, 0, a.m, n, rows);
        continue;
      }
      store<kDecodeC>(acc, 4 * a.m);
      store_transposed(acc, a.m, a.m, rows, a.y + n, a.ldy);
    }
  }

  // Prefill shape: 128 weight rows at a time decoded (through `rows16`) into B tiles at `panel`, then every
  // group of x rows (xq, ⌈m / 32⌉ · 32 rows, the ones past m zeros) against them.
  void prefill_shape(const uint16_t* xq, uint16_t* rows16, uint32_t* panel, float* acc) const {
    for (int64_t p0 = a.n0; p0 < a.n1; p0 += kPanelRows) {
      const int64_t p1 = std::min(a.n1, p0 + kPanelRows);
      bool clean = true;
      for (int64_t n = p0, g = 0; n < p1; n += kTile, ++g) {
        const int64_t rows = std::min(kTile, p1 - n);
        clean = clean && avx512_bf16::mxfp4_decode_rows(*a.w, n, rows, rows16, ld);
        if (!clean) break;
        for (int64_t s = 0; s < steps; ++s) {
          __m512i v[16];
          for (int64_t j = 0; j < 16; ++j)
            v[j] = j < rows ? _mm512_load_si512(rows16 + j * ld + s * 32) : _mm512_setzero_si512();
          transpose16(v);
          uint32_t* dst = panel + (g * steps + s) * kTileWords;
          for (int r = 0; r < 16; ++r) _mm512_store_si512(dst + r * 16, v[r]);
        }
      }
      if (!clean) {
        quant::reference_part(a, reference::linear_mxfp4_medium_tile, 0, a.m, p0, p1 - p0);
        continue;
      }
      for (int64_t i0 = 0; i0 < a.m; i0 += kRowGroup)
        panel_rows(xq + i0 * ld, ld, panel, steps, p0, p1, std::min(kRowGroup, a.m - i0), a.y + i0 * a.ldy,
                   a.ldy, acc);
    }
  }
};

}  // namespace

void linear_mxfp4_medium(const LinearArgs& a) {
  quant::check_linear_args(a, WeightFormat::mxfp4);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Mxfp4TileCall call(a);
  const bool decode = a.m <= kDecodeRows;
  // x rows rounded to bf16 in chunk order; for the prefill shape up to a whole group of 32 (zeros past m)
  const int64_t x_rows = decode ? a.m : (a.m + kRowGroup - 1) / kRowGroup * kRowGroup;
  Buffer<uint16_t> xq_buffer, rows_buffer;
  Buffer<uint32_t> tiles_buffer;  // decode: the x B tiles; prefill: 128 rows' decoded weights
  uint16_t* xq = xq_buffer.ensure(static_cast<size_t>(x_rows * call.ld));
  const avx512_bf16::Fp4Order order;
  for (int64_t i = 0; i < a.m; ++i)
    avx512_bf16::pack_fp4_x_row(order, a.x + i * a.ldx, call.k, call.padded, xq + i * call.ld, 32);
  for (int64_t i = a.m; i < x_rows; ++i)
    std::memset(xq + i * call.ld, 0, static_cast<size_t>(call.padded) * 2);
  uint16_t* rows = rows_buffer.ensure(static_cast<size_t>(
      decode ? (kAheadGroups + 1) * kTile * kGroupChunks * kFp4Bf16DotChunk : kTile * call.ld));
  uint32_t* tiles =
      tiles_buffer.ensure(static_cast<size_t>((decode ? 1 : kPanelRows / kTile) * call.steps * kTileWords));
  alignas(64) float acc[4 * kTileWords];
  load_config(linear_tile_config(decode, a.m));
  if (decode)
    call.decode_shape(x_tiles(xq, call.ld, a.m, call.steps, tiles), rows, acc);
  else
    call.prefill_shape(xq, rows, tiles, acc);
  release();
}

}  // namespace xmoe::kernels::amx
