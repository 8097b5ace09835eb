// The AMX level's `medium` linear for FP8 block weights (linear_quant_bf16tile.hpp's arithmetic, bit for bit
// the scalar reference's for every m, column block and thread). The weights are FP8 in memory, so unlike
// the BF16 kernel's they cannot be tile operands in place: their codes are turned into bf16 by
// fp8_codes_avx512_bf16.hpp's register decode and stored as tiles first. Each block of weight rows (one
// multiplier vector) scales and rounds the activations anew.
//  * Up to kDecodeRows x rows (decode, batched decode): yᵀ = W · xᵀ. Each 64-code chunk of 16 weight rows
//    is decoded into two A tiles in a small ring of buffers that stays in L1, kDecodeAhead chunks before
//    the tiles are loaded (a tile load waits for the older stores to its lines), with the rows' lines
//    kPrefetchChunks on prefetched (without, the 16 rows read at 8 GB/s instead of 14 on 2 threads). The
//    scaled x rows are B tiles and the accumulator only as wide as the rows (x tiles of 64 B a step for
//    one row: the block's stay in L1). Measured on Sapphire Rapids, 2 threads (`xmoe linear-bench
//    --matmul-precision medium --isa amx`, then `--isa avx512_bf16`): one row streams at 9.0 / 9.9 / 15.7
//    GB/s for the three shapes against VDPBF16PS's 9.9 / 10.1 / 16.3; at 8 and 16 rows a 2048 × 2048
//    FP8 linear took 338 and 389 µs against VDPBF16PS's 625 and 961. Two weight tiles per pass (two
//    accumulators) and decoding 2-8 chunks of a row at a time were slower.
//  * More x rows (prefill): y = x · Wᵀ. The block's weights are decoded once into B tiles (each 16 × 16
//    dword step transposed in registers), and the scaled x rows are A tiles as they are packed: 2 × 2 tiles
//    over 32 x rows × 32 outputs, the decoded block reused from L2 by every group of x rows. Prefill (512
//    rows) ran at 1000-1160 GFLOP/s against VDPBF16PS's 155-163 (the same linear-bench runs).
// A NaN code (which the register decode does not reproduce) sends its tile or block to the reference.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/fp8_codes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/cpu/linear_tiles_amx.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::amx {
namespace {

using avx512_bf16::Fp8Decoder;
using avx512_bf16::Fp8Order;
using avx512_bf16::Fp8Scales;

constexpr int64_t kDecodeRows = kFp8TileDecodeRows;
constexpr int64_t kDecodeAhead = 3;     // decode: chunks decoded ahead of the tile products
constexpr int64_t kPrefetchChunks = 8;  // decode: chunks of each row prefetched ahead
constexpr int64_t kRowGroup = 32;       // prefill: x rows per group of A tiles
constexpr int64_t kPanelRows = 128;  // prefill: weight rows decoded at a time (one block of FP8's 128 × 128)

struct Fp8TileCall {
  const LinearArgs& a;
  int64_t k, padded, steps;
  int64_t ldq;  // words between scaled x rows (padded plus a line, so 16 rows do not share an L1 set)
  const Fp8Order order;
  const Fp8Scales scales;

  explicit Fp8TileCall(const LinearArgs& args)
      : a(args),
        k(args.w->cols),
        padded((k + 63) / 64 * 64),
        steps(padded / kBf16TileStep),
        ldq(padded + 32),
        order(),
        scales(*args.w) {}

  const uint8_t* row(int64_t n) const {
    return reinterpret_cast<const uint8_t*>(a.w->data) + n * a.w->row_bytes;
  }

  // x rows [i0, i0 + h), scaled by `mult` and rounded, in chunk order at xq + i · ldq; rows h..16·tiles
  // zeros.
  void pack_x(const float* mult, int64_t i0, int64_t h, int64_t tiles, uint16_t* xq) const {
    for (int64_t i = 0; i < h; ++i)
      avx512_bf16::pack_fp8_x_row(order, a.x + (i0 + i) * a.ldx, k, mult, padded, xq + i * ldq, 32);
    for (int64_t i = h; i < tiles * kTile; ++i) std::memset(xq + i * ldq, 0, static_cast<size_t>(padded) * 2);
  }

  // Decode shape: outputs [n, n + rows) (rows ≤ 16) against the x B tiles (tile registers as
  // linear_fp8_block_medium configures them); accumulator [output][x row] to acc, a.m floats per output.
  // `ring`: kDecodeAhead + 1 chunks' pairs of A tiles, rows at 64 bytes. False on a NaN code.
  bool decode_tile(int64_t n, int64_t rows, const uint32_t* xb, uint16_t* ring, float* acc) const {
    constexpr int64_t kTileHalf = 2 * kTileWords;  // one A tile in 16-bit words
    const int64_t chunks = padded / 64, rb = a.w->row_bytes;
    const uint8_t* const base = row(n);
    // the next tile's rows, prefetched while this tile's last chunks are decoded
    const uint8_t* const next = n + kTile + rows <= a.w->rows ? row(n + kTile) : nullptr;
    Fp8Decoder dec;
    zero<kDecodeC>();
    // Chunk q is decoded kDecodeAhead iterations before its tiles are loaded, so its stores have left the
    // store buffer by then (a tile load waits for every older store to the lines it reads).
    for (int64_t q = 0; q < chunks + kDecodeAhead; ++q) {
      if (q < chunks) {
        uint16_t* t = ring + q % (kDecodeAhead + 1) * 2 * kTileHalf;
        const int64_t c = q * 64, pc = c + kPrefetchChunks * 64;
        const uint8_t* ahead = pc < k ? base + pc : next != nullptr ? next + (pc - padded) : nullptr;
        for (int64_t j = 0; j < rows; ++j) {
          if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + j * rb), _MM_HINT_T0);
          bool fixup;
          const __m512i raw = dec.load(base + j * rb + c, k - c, fixup);
          _mm512_store_si512(t + j * 32, (__m512i)dec.step(raw, 0, fixup));
          _mm512_store_si512(t + kTileHalf + j * 32, (__m512i)dec.step(raw, 1, fixup));
        }
      }
      if (q < kDecodeAhead) continue;
      const int64_t d = q - kDecodeAhead;
      const uint16_t* t = ring + d % (kDecodeAhead + 1) * 2 * kTileHalf;
      static_for<2>([&](auto step) {
        constexpr int S = decltype(step)::value;
        decode_product<S>(t + S * kTileHalf, 64, xb + (2 * d + S) * 16 * a.m, a.m);
      });
    }
    store<kDecodeC>(acc, 4 * a.m);
    return dec.clean();
  }

  // Prefill shape: outputs [n, n + cols) (cols ≤ 16) decoded into B tiles, step s at panel + s · 256 words:
  // word [r][o] holds output o's pair r; outputs past cols are zeros. False on a NaN code.
  bool decode_panel(int64_t n, int64_t cols, uint32_t* panel) const {
    Fp8Decoder dec;
    for (int64_t c = 0, q = 0; c < k; c += 64, ++q)
      for (int step = 0; step < 2; ++step) {
        __m512i v[16];
        for (int64_t j = 0; j < 16; ++j) {
          if (j >= cols) {
            v[j] = _mm512_setzero_si512();
            continue;
          }
          bool fixup;
          const __m512i raw = dec.load(row(n + j) + c, k - c, fixup);
          v[j] = (__m512i)dec.step(raw, step, fixup);
        }
        transpose16(v);
        uint32_t* dst = panel + (2 * q + step) * kTileWords;
        for (int r = 0; r < 16; ++r) _mm512_store_si512(dst + r * 16, v[r]);
      }
    return dec.clean();
  }

  // Decode shape: the outputs [s0, s1) of one block of weight rows (one multiplier vector), x scaled and
  // packed once for the block.
  void decode_rows(int64_t s0, int64_t s1, const float* mult, uint16_t* xq, uint32_t* xb, uint16_t* ring,
                   float* acc) const {
    pack_x(mult, 0, a.m, 0, xq);
    const uint32_t* xt = x_tiles(xq, ldq, a.m, steps, xb);
    for (int64_t n = s0; n < s1; n += kTile) {
      const int64_t rows = std::min(kTile, s1 - n);
      if (decode_tile(n, rows, xt, ring, acc))
        store_transposed(acc, a.m, a.m, rows, a.y + n, a.ldy);
      else
        quant::reference_part(a, reference::linear_fp8_block_medium_tile, 0, a.m, n, rows);
    }
  }

  void prefill_rows(int64_t s0, int64_t s1, const float* mult, uint16_t* xq, uint32_t* panel,
                    float* acc) const {
    const int64_t groups = (s1 - s0 + kTile - 1) / kTile;
    bool clean = true;
    for (int64_t g = 0; g < groups; ++g)
      clean &=
          decode_panel(s0 + g * kTile, std::min(kTile, s1 - s0 - g * kTile), panel + g * steps * kTileWords);
    if (!clean) return quant::reference_part(a, reference::linear_fp8_block_medium_tile, 0, a.m, s0, s1 - s0);
    for (int64_t i0 = 0; i0 < a.m; i0 += kRowGroup) {
      const int64_t h = std::min(kRowGroup, a.m - i0), mt = (h + kTile - 1) / kTile;
      pack_x(mult, i0, h, mt, xq);
      panel_rows(xq, ldq, panel, steps, s0, s1, h, a.y + i0 * a.ldy, a.ldy, acc);
    }
  }
};

}  // namespace

void linear_fp8_block_medium(const LinearArgs& a) {
  quant::check_linear_args(a, WeightFormat::fp8_block);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Fp8TileCall call(a);
  std::vector<float> mult(static_cast<size_t>(call.k));
  alignas(64) float acc[4 * kTileWords];
  const bool decode = a.m <= kDecodeRows;
  Buffer<uint16_t> xq_buffer, ring_buffer;
  Buffer<uint32_t> tiles_buffer;  // decode: the x B tiles; prefill: a piece's decoded weights
  uint16_t* xq = xq_buffer.ensure(static_cast<size_t>((decode ? a.m : kRowGroup) * call.ldq));
  uint32_t* tiles =
      tiles_buffer.ensure(static_cast<size_t>((decode ? 1 : kPanelRows / kTile) * call.steps * kTileWords));
  uint16_t* ring = ring_buffer.ensure(static_cast<size_t>((kDecodeAhead + 1) * 2 * 2 * kTileWords));
  if (decode)  // the first tile's first lines, on their way while x is scaled and packed
    for (int64_t j = 0; j < std::min(kTile, a.n1 - a.n0); ++j)
      for (int64_t c = 0; c < std::min(call.k, kPrefetchChunks * 64); c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(call.row(a.n0 + j) + c), _MM_HINT_T0);
  load_config(linear_tile_config(decode, a.m));
  avx512_bf16::for_each_row_block(*a.w, a.n0, a.n1, [&](int64_t s0, int64_t s1) {
    call.scales.row(s0, mult.data());
    if (decode) return call.decode_rows(s0, s1, mult.data(), xq, tiles, ring, acc);
    for (int64_t p0 = s0; p0 < s1; p0 += kPanelRows)
      call.prefill_rows(p0, std::min(s1, p0 + kPanelRows), mult.data(), xq, tiles, acc);
  });
  release();
}

}  // namespace xmoe::kernels::amx
