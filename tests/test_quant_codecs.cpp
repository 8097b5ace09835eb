// E4M3 / E2M1 / E8M0 codecs against PyTorch (tests/data/quant/codes.safetensors,
// tools/make_quant_fixtures.py): every code point decodes to torch's value bit for bit, and the encoders
// reproduce torch's float8_e4m3fn cast and the reference quantizers' E2M1 rounding on sweeps over every
// midpoint, its neighbours and random inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/quant/codecs.hpp"
#include "quant_fixture.hpp"

namespace xmoe::kernels::quant {
namespace {

using test::fixture_values;
using test::float_bits;
using test::same_float;

TEST(QuantCodecs, E4M3EveryCodePointDecodesAsTorch) {
  const auto f = test::quant_fixture("codes");
  const auto want = fixture_values<float>(f, "e4m3_values");
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same_float(e4m3_to_f32(static_cast<uint8_t>(c)), want[c]))
        << "code 0x" << std::hex << c << ": " << e4m3_to_f32(static_cast<uint8_t>(c)) << " vs torch "
        << want[c];
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)) && std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(float_bits(e4m3_to_f32(0x80)), 0x80000000u);  // −0
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));     // the smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
}

TEST(QuantCodecs, E8M0EveryCodePointDecodesAsTorch) {
  const auto f = test::quant_fixture("codes");
  const auto want = fixture_values<float>(f, "e8m0_values");
  ASSERT_EQ(want.size(), 256u);
  for (int c = 0; c < 256; ++c)
    EXPECT_TRUE(same_float(e8m0_to_f32(static_cast<uint8_t>(c)), want[c])) << "code " << c;
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
}

TEST(QuantCodecs, E2M1EveryCodePointDecodesAsTheOcpFormula) {
  const auto f = test::quant_fixture("codes");
  const auto want = fixture_values<float>(f, "e2m1_values");
  ASSERT_EQ(want.size(), 16u);
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(float_bits(e2m1_to_f32(static_cast<uint8_t>(c))), float_bits(want[c]));
}

TEST(QuantCodecs, E4M3EncoderMatchesTorchCast) {
  const auto f = test::quant_fixture("codes");
  const auto in = fixture_values<float>(f, "e4m3_cast_in");
  const auto want = fixture_values<uint8_t>(f, "e4m3_cast_out");
  ASSERT_EQ(in.size(), want.size());
  ASSERT_GT(in.size(), 10000u);
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i)
    if (f32_to_e4m3(in[i]) != want[i] && ++bad < 10)
      ADD_FAILURE() << "f32 " << in[i] << " (0x" << std::hex << float_bits(in[i]) << "): 0x"
                    << int(f32_to_e4m3(in[i])) << " vs torch 0x" << int(want[i]);
  EXPECT_EQ(bad, 0);
  // Round trip of every finite code.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c);
  }
}

TEST(QuantCodecs, E2M1EncoderMatchesReferenceQuantizers) {
  const auto f = test::quant_fixture("codes");
  const auto in = fixture_values<float>(f, "e2m1_cast_in");
  const auto want = fixture_values<uint8_t>(f, "e2m1_cast_out");
  ASSERT_EQ(in.size(), want.size());
  ASSERT_GT(in.size(), 2000u);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(f32_to_e2m1(in[i]), want[i]) << "input " << in[i];
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);  // triton_kernels keeps the sign bit
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_e2m1(-1e30f), 0xF);
}

}  // namespace
}  // namespace xmoe::kernels::quant
