// Quantized K/V rows: the E4M3 and int8 codes against references computed in double, the row
// format (scales, padding, sizes), and the layout a quantized cache plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "kvoffload/quant.hpp"

namespace kvo {
namespace {

// Every finite E4M3 value by code, from the format's definition, in double.
double e4m3_reference(int code) {
  const int sign = code & 0x80 ? -1 : 1;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, -6);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

bool is_e4m3_nan(int code) {
  return (code & 0x7f) == 0x7f;
}

// The code a correct encoder gives x: the nearest finite value, ties to the even code, magnitudes
// beyond 448 saturated.
int e4m3_nearest(double x) {
  x = std::max(-448.0, std::min(448.0, x));
  int best = -1;
  double best_error = 0;
  for (int code = 0; code < 256; ++code) {
    if (is_e4m3_nan(code)) continue;
    const double value = e4m3_reference(code);
    if ((value < 0) != (x < 0) && value != 0) continue;
    if (value == 0 && ((code & 0x80) != 0) != std::signbit(x)) continue;
    const double error = std::fabs(value - x);
    if (best < 0 || error < best_error || (error == best_error && (code & 1) == 0)) {
      best = code;
      best_error = error;
    }
  }
  return best;
}

TEST(Quant, E4M3DecodesEveryCodeExactly) {
  for (int code = 0; code < 256; ++code) {
    const float value = quant::e4m3_to_float(static_cast<std::uint8_t>(code));
    if (is_e4m3_nan(code)) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(value), e4m3_reference(code)) << code;
    EXPECT_EQ(quant::float_to_e4m3(value), code) << code;  // every value encodes to itself
  }
  EXPECT_EQ(quant::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(quant::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Quant, E4M3EncodesToTheNearestValueTiesToEven) {
  std::mt19937 rng(11);
  std::vector<float> xs;
  // Random magnitudes over the whole range and beyond, midpoints between neighbours, and edges.
  std::uniform_real_distribution<float> exponent(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(exponent(rng));
    xs.push_back(rng() % 2 ? x : -x);
  }
  for (int code = 0; code < 0x7e; ++code) {
    const double mid = (e4m3_reference(code) + e4m3_reference(code + 1)) / 2;
    xs.push_back(static_cast<float>(mid));
    xs.push_back(-static_cast<float>(mid));
    xs.push_back(std::nextafter(static_cast<float>(mid), 0.0f));
    xs.push_back(std::nextafter(static_cast<float>(mid), 1000.0f));
  }
  for (float edge : {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 480.0f, 1e30f, -1e30f,
                     std::numeric_limits<float>::infinity(), std::ldexp(1.0f, -10),
                     std::ldexp(1.0f, -11), std::ldexp(3.0f, -11)}) {
    xs.push_back(edge);
  }
  for (float x : xs) {
    ASSERT_EQ(quant::float_to_e4m3(x), e4m3_nearest(x)) << x;
  }
  EXPECT_EQ(quant::float_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
}

TEST(Quant, Int8RoundsToNearestEvenAndClamps) {
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(2.5f, DType::kInt8)), 2);
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(3.5f, DType::kInt8)), 4);
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(-2.5f, DType::kInt8)), -2);
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(127.4f, DType::kInt8)), 127);
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(200.0f, DType::kInt8)), 127);
  EXPECT_EQ(static_cast<std::int8_t>(quant::encode(-200.0f, DType::kInt8)), -127);
  EXPECT_EQ(quant::encode(std::nanf(""), DType::kInt8), 0);
}

// A row of random heads quantized and read back: the scales are max|x| / max code, each element
// within half a step of its value (int8) or within E4M3's rounding (fp8), bounds taken in double.
TEST(Quant, RowsRoundTripWithinTheFormatsError) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kInt8, DType::kFP8E4M3}) {
    for (const auto& [kv_heads, dim] :
         std::vector<std::pair<int, int>>{{8, 128}, {3, 64}, {1, 6}, {5, 3}}) {
      const int elements = kv_heads * dim;
      std::vector<float> x(static_cast<std::size_t>(elements));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int h = 0; h < kv_heads; ++h) {
        const float spread = std::exp2(static_cast<float>(static_cast<int>(rng() % 20) - 10));
        for (int e = 0; e < dim; ++e)
          x[static_cast<std::size_t>(h * dim + e)] = normal(rng) * spread;
      }
      x[0] *= 40.0f;  // an outlier in head 0
      const std::uint64_t row_bytes = quant_row_bytes(kv_heads, dim);
      ASSERT_EQ(row_bytes, (static_cast<std::uint64_t>(elements) + 3) / 4 * 4 + 4u * kv_heads);
      std::vector<std::uint8_t> row(row_bytes, 0xcd);
      quantize_row(x.data(), kv_heads, dim, dtype, row.data());
      std::vector<float> back(x.size());
      dequantize_row(row.data(), kv_heads, dim, dtype, back.data());
      for (std::uint64_t i = static_cast<std::uint64_t>(elements);
           i < quant_scale_offset(kv_heads, dim); ++i) {
        EXPECT_EQ(row[i], 0) << "padding byte " << i;
      }
      for (int h = 0; h < kv_heads; ++h) {
        double amax = 0;
        for (int e = 0; e < dim; ++e) amax = std::max(amax, std::fabs(double{x[h * dim + e]}));
        float scale = 0;
        std::memcpy(&scale, row.data() + quant_scale_offset(kv_heads, dim) + 4 * h, 4);
        const double max_code = dtype == DType::kInt8 ? 127 : 448;
        EXPECT_NEAR(scale, amax / max_code, amax / max_code * 1e-6);
        for (int e = 0; e < dim; ++e) {
          const double value = x[static_cast<std::size_t>(h * dim + e)];
          const double error = std::fabs(back[static_cast<std::size_t>(h * dim + e)] - value);
          // int8: half a step; fp8: half an ulp of 3 mantissa bits (2^-4 relative) above the
          // smallest normal, half the subnormal step (2^-10 of the scale) below; plus the float
          // rounding of x / scale and of the product.
          const double bound = dtype == DType::kInt8
                                   ? scale * 0.5
                                   : std::max(std::fabs(value) / 16, scale * std::ldexp(1.0, -10));
          EXPECT_LE(error, bound * (1 + 1e-5) + std::fabs(value) * 1e-6)
              << dtype_name(dtype) << " head " << h << " element " << e << " x=" << value;
        }
      }
    }
  }
}

TEST(Quant, AHeadOfZerosHasScaleZeroAndZeroBytes) {
  std::vector<float> x(2 * 8, 0.0f);
  x[8 + 3] = -2.0f;  // head 1 only
  x[2] = -0.0f;
  std::vector<std::uint8_t> row(quant_row_bytes(2, 8), 0xcd);
  quantize_row(x.data(), 2, 8, DType::kFP8E4M3, row.data());
  for (int e = 0; e < 8; ++e) EXPECT_EQ(row[static_cast<std::size_t>(e)], 0) << e;
  float scales[2];
  std::memcpy(scales, row.data() + 16, 8);
  EXPECT_EQ(scales[0], 0.0f);
  EXPECT_FALSE(std::signbit(scales[0]));
  EXPECT_EQ(scales[1], 2.0f / 448.0f);
  EXPECT_EQ(row[8 + 3], 0xfe);  // -448: the largest magnitude
}

TEST(Quant, RowBytesAndTheLayoutOfAQuantizedCache) {
  EXPECT_EQ(kv_row_bytes(DType::kBF16, 8, 128), 2048u);
  EXPECT_EQ(kv_row_bytes(DType::kFP8E4M3, 8, 128), 8u * 128 + 32);
  EXPECT_EQ(kv_row_bytes(DType::kInt8, 3, 6), 20u + 12);  // 18 elements padded to 20

  CacheConfig c;
  c.layers = 4;
  c.kv_heads = 3;
  c.head_dim = 6;
  c.v_head_dim = 2;
  c.max_seq = 10;
  c.slots = 2;
  c.dtype = DType::kInt8;
  c.backend = BackendKind::kHost;
  c.resident_layers = 1;
  const KvLayout l = kv_layout(c);
  EXPECT_EQ(l.element_size, 1u);
  EXPECT_EQ(l.k_row_bytes, 32u);
  EXPECT_EQ(l.v_row_bytes, 8u + 12);  // 6 elements padded to 8, 3 scales
  EXPECT_EQ(l.k_scale_offset, 20u);
  EXPECT_EQ(l.v_scale_offset, 8u);
  EXPECT_EQ(l.k_offset(1, 3), (10u + 3) * 32);

  OffloadedStaticCache cache(c);
  cache.begin_step({1, 0});
  const LayerView view = cache.acquire(0);
  EXPECT_EQ(view.layout.dtype, DType::kInt8);
  EXPECT_EQ(view.token_stride, 32);
  EXPECT_EQ(view.slot_stride, 320);
  EXPECT_EQ(view.head_stride, 6);
  EXPECT_EQ(view.v_token_stride, 20);
  EXPECT_EQ(view.layout.k_scale_offset, 20u);
  EXPECT_EQ(view.layout.v_scale_offset, 8u);
  cache.abort_step();
}

TEST(Quant, NamesAndParsers) {
  EXPECT_EQ(parse_dtype("fp8"), DType::kFP8E4M3);
  EXPECT_EQ(parse_dtype("e4m3"), DType::kFP8E4M3);
  EXPECT_EQ(parse_dtype("int8"), DType::kInt8);
  EXPECT_STREQ(dtype_name(DType::kFP8E4M3), "fp8");
  EXPECT_STREQ(dtype_name(DType::kInt8), "int8");
  EXPECT_EQ(dtype_size(DType::kInt8), 1u);
  EXPECT_TRUE(is_quantized(DType::kInt8));
  EXPECT_FALSE(is_quantized(DType::kBF16));
}

}  // namespace
}  // namespace kvo
