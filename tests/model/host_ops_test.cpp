// The host path's GEMMs and attention against float64 references on random inputs, in every
// cache dtype, through strided views; and the properties the decoder relies on: the same bits
// for any thread count, and a decode row's bits independent of the rows beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "expect_error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/host_gemm_bf16.hpp"
#include "model/host/host_gemm_q8.hpp"
#include "model/host/host_kernels.hpp"
#include "model/host/host_linear.hpp"
#include "model/host/host_ops.hpp"
#include "model_test_util.hpp"
#include "rounding.hpp"

namespace kvo::model {
namespace {

std::size_t elem_size(DType type) {
  return type == DType::kF32 ? 4 : 2;
}

// n random values of `type` (uniform in [-range, range]) and their exact f32 values.
struct Values {
  std::vector<unsigned char> bytes;
  std::vector<float> exact;
};
Values random_values(std::size_t n, DType type, float range, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-range, range);
  Values v;
  v.bytes.resize(n * elem_size(type));
  v.exact.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    store_elem(v.bytes.data(), static_cast<std::int64_t>(i), type, dist(rng));
    v.exact[i] = load_elem(v.bytes.data(), static_cast<std::int64_t>(i), type);
  }
  return v;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

ModelConfig attention_config(int heads, int kv_heads, int head_dim, int window) {
  ModelConfig c;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = 2 * c.hidden_size;
  c.vocab_size = 100;
  c.sliding_window = window;
  return c;
}

// Every bound below is derived from float32's unit roundoff and gamma_n (rounding.hpp), operation
// by operation.
using testing::gamma;
using testing::kU;

OpsShape shape_of(const ModelConfig& c, DType type, int max_rows, int slots, int max_seq,
                  int threads) {
  OpsShape s;
  s.config = c;
  s.weight_dtype = type;
  s.kv_dtype = s.weight_dtype;
  s.max_rows = max_rows;
  s.max_decode_rows = slots;
  s.max_seq = max_seq;
  s.threads = threads;
  return s;
}

const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// ---- GEMMs -----------------------------------------------------------------------------------

// Both paths (a few rows: in place; many: OpenBLAS tiles), every weight dtype, bias and
// accumulate, widths that are not multiples of the vector or tile sizes.
TEST(HostLinear, MatchesFloat64) {
  std::mt19937 rng(1);
  const int in = 200, out = 150;
  for (DType type : kTypes) {
    const Values w = random_values(static_cast<std::size_t>(out) * in, type, 0.5f, rng);
    const Values bias = random_values(out, type, 0.5f, rng);
    const ModelConfig c = attention_config(2, 1, 100, 0);
    HostOps ops(shape_of(c, type, 300, 1, 16, 2));
    for (int n : {1, 3, 15, 16, 300}) {
      for (bool with_bias : {false, true}) {
        for (bool accumulate : {false, true}) {
          const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * in, rng);
          const std::vector<float> y0 = random_floats(static_cast<std::size_t>(n) * out, rng);
          std::vector<float> y = y0;
          ops.linear(x.data(), n, in, WeightRef{w.bytes.data(), element_type(type)},
                     with_bias ? bias.bytes.data() : nullptr, out, y.data(), accumulate);
          // The AVX512_BF16 GEMM rounds x to bf16 first: 2^-8 of each term more.
          const bool rounds_x = n >= HostLinear::kGemmMinRows && uses_bf16_gemm(type, false);
          const double x_rounding = rounds_x ? 0x1p-8 : 0;
          double worst = 0;  // the largest error as a share of the f32-only bound
          for (int t = 0; t < n; ++t) {
            for (int o = 0; o < out; ++o) {
              double sum = 0, magnitude = 0;
              for (int i = 0; i < in; ++i) {
                const double term = static_cast<double>(x[t * in + i]) * w.exact[o * in + i];
                sum += term;
                magnitude += std::fabs(term);
              }
              const double products = magnitude;
              if (with_bias) sum += bias.exact[o], magnitude += std::fabs(bias.exact[o]);
              if (accumulate) sum += y0[t * out + o], magnitude += std::fabs(y0[t * out + o]);
              // A dot product of `in` terms plus the bias and the accumulated value: gamma_(in+2)
              // of the terms' magnitudes, in any order (f16/bf16 weights are widened exactly);
              // with x rounded to bf16, 2^-8 of the products' magnitudes before that, and the
              // instruction's flush of subnormals (2^-126 a term).
              const double bound = gamma(in + 2) * (magnitude + x_rounding * products) +
                                   x_rounding * products + in * 0x1p-126;
              ASSERT_NEAR(y[t * out + o], sum, bound)
                  << "dtype " << static_cast<int>(type) << " n " << n << " t " << t << " o " << o;
              worst =
                  std::max(worst, std::fabs(y[t * out + o] - sum) / (gamma(in + 2) * magnitude));
            }
          }
          // The bf16 GEMM ran (its rounding of x shows), or it did not and f32's bound held.
          if (rounds_x) {
            EXPECT_GT(worst, 1) << "n " << n;
          } else {
            EXPECT_LE(worst, 1) << "n " << n;
          }
        }
      }
    }
  }
}

// The AVX512_BF16 kernel itself against the exact products of x rounded to bf16 (round to
// nearest even) and the bf16 weights: only its f32 sums differ, gamma_in of the terms. Widths
// around the vector, pair and chunk sizes (512 inputs a chunk), columns short of a panel, rows
// short of a block; y accumulated into or not.
TEST(Bf16Gemm, MatchesTheExactProductsOfItsRoundedInputs) {
  if (!bf16_gemm::available()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(3);
  std::vector<float> scratch(bf16_gemm::scratch_bytes(0) / sizeof(float));
  for (const auto& [rows, cols, in] : std::vector<std::tuple<int, int, int>>{{1, 1, 1},
                                                                             {3, 17, 2},
                                                                             {8, 32, 31},
                                                                             {9, 128, 33},
                                                                             {16, 100, 511},
                                                                             {5, 128, 512},
                                                                             {12, 127, 513},
                                                                             {17, 64, 1100},
                                                                             {2, 33, 1537}}) {
    const Values w = random_values(static_cast<std::size_t>(cols) * in, DType::kBF16, 0.5f, rng);
    std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * (in + 3), rng);
    const int ld_x = in + 3, ld_y = cols + 5;
    for (bool accumulate : {false, true}) {
      const std::vector<float> y0 = random_floats(static_cast<std::size_t>(rows) * ld_y, rng);
      std::vector<float> y = y0;
      bf16_gemm::multiply(x.data(), rows, in, ld_x,
                          reinterpret_cast<const std::uint16_t*>(w.bytes.data()), cols, accumulate,
                          y.data(), ld_y, scratch.data());
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < ld_y; ++c) {
          const float got = y[r * ld_y + c];
          if (c >= cols) {  // past the columns: untouched
            ASSERT_EQ(got, y0[r * ld_y + c]) << r << " " << c;
            continue;
          }
          double sum = accumulate ? y0[r * ld_y + c] : 0;
          double magnitude = std::fabs(sum);
          for (int i = 0; i < in; ++i) {
            const double xi = bf16_to_float(float_to_bf16(x[r * ld_x + i]));
            const double term = xi * w.exact[static_cast<std::size_t>(c) * in + i];
            sum += term;
            magnitude += std::fabs(term);
          }
          ASSERT_NEAR(got, sum, gamma(in + 1) * magnitude + in * 0x1p-126)
              << rows << "x" << cols << "x" << in << " at " << r << ", " << c;
        }
      }
    }
  }
}

// Random blocks of every quantized GGUF type, their scales finite: the kernels' dequantization
// (each level's clone, the switch resolved per type) gives the reference header's bits
// (model/checkpoint/ggml_blocks.hpp, itself equal to the gguf package's), and a decode-sized
// product over the blocks gives, bit for bit, dot() of the expanded rows (linear_rows over f32).
TEST(HostLinear, GgufBlocksDequantizeAndMultiplyAsTheirExpandedRows) {
  std::mt19937 rng(7);
  const int in = 512, out = 37;
  for (const std::uint32_t type :
       {blocks::kQ8_0, blocks::kQ4_0, blocks::kQ4_1, blocks::kQ4_K, blocks::kQ5_K, blocks::kQ6_K}) {
    const int per_block = blocks::block_elements(type);
    const int block_bytes = blocks::block_bytes(type);
    const int row_blocks = in / per_block;
    const std::vector<std::uint8_t> w = testing::random_block_matrix(type, out, in, rng);
    std::vector<float> expected(static_cast<std::size_t>(out) * in), got(expected.size());
    for (int b = 0; b < out * row_blocks; ++b) {
      blocks::dequantize_block(type, &w[static_cast<std::size_t>(b * block_bytes)],
                               &expected[static_cast<std::size_t>(b * per_block)]);
    }
    kernels::dequantize_rows(type, w.data(), out, in, got.data());
    ASSERT_EQ(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)), 0)
        << ggml_type(type)->name;
    // A part of 32 at a time (what each CUDA thread dequantizes): the block's values, bit for bit.
    for (int b = 0; b < out * row_blocks; ++b) {
      for (int part = 0; part < per_block / 32; ++part) {
        float values[32];
        blocks::dequantize_part(type, &w[static_cast<std::size_t>(b * block_bytes)], part, values);
        ASSERT_EQ(
            std::memcmp(values, &expected[static_cast<std::size_t>(b * per_block + 32 * part)],
                        sizeof values),
            0)
            << ggml_type(type)->name << " block " << b << " part " << part;
        // An element at a time (what a CUDA lane computes): the same bits.
        for (int l = 0; l < 32; ++l) {
          const float one =
              blocks::part_element(type, &w[static_cast<std::size_t>(b * block_bytes)], part, l);
          ASSERT_EQ(std::memcmp(&one, &values[l], sizeof one), 0)
              << ggml_type(type)->name << " block " << b << " part " << part << " element " << l;
        }
      }
    }
    for (const int rows : {1, 3, 15}) {
      std::vector<float> x(static_cast<std::size_t>(rows) * in);
      std::normal_distribution<float> normal;
      for (auto& v : x) v = normal(rng);
      std::vector<float> y_blocks(static_cast<std::size_t>(rows) * out, 1.0f);
      std::vector<float> y_rows(y_blocks), scratch(static_cast<std::size_t>(in) + 16 * rows);
      kernels::linear_rows_blocks(x.data(), rows, in, in, w.data(), type, DType::kF32, nullptr, 0,
                                  out, y_blocks.data(), out, true, scratch.data());
      kernels::linear_rows(x.data(), rows, in, in, expected.data(), DType::kF32, DType::kF32,
                           nullptr, 0, out, y_rows.data(), out, true, scratch.data());
      EXPECT_EQ(y_blocks, y_rows) << ggml_type(type)->name << ", " << rows << " rows";
    }
  }
}

// f16 and bf16 weights (random bits: subnormals, signed zeros and wide exponents among them, NaN
// and infinity left out) and a bias of their type or in f32 (an f32 model's kept matrix):
// decode-sized products (the AVX-512 kernel on a CPU with it, up to 8 x rows per pass, strided x
// and y) give, bit for bit, linear_rows over the same weights and bias expanded to f32; `in` not a
// multiple of 16 takes the portable loops.
TEST(HostLinear, HalfWeightRowsMultiplyAsTheirExpandedRows) {
  std::mt19937 rng(5);
  const int out = 37;
  for (const DType type : {DType::kF16, DType::kBF16}) {
    for (const int in : {512, 208, 200}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + ", in " + std::to_string(in));
      std::uniform_int_distribution<int> bits(0, 0xFFFF);
      std::vector<std::uint16_t> w(static_cast<std::size_t>(out) * in), bias(out);
      std::vector<float> wide(w.size()), wide_bias(bias.size());
      const auto draw = [&](std::uint16_t& h, float& f) {
        do {
          h = static_cast<std::uint16_t>(bits(rng));
          f = type == DType::kF16 ? f16_to_float(h) : bf16_to_float(h);
        } while (!std::isfinite(f) || std::fabs(f) > 1e4f);  // the sums stay finite
      };
      for (std::size_t i = 0; i < w.size(); ++i) draw(w[i], wide[i]);
      for (std::size_t i = 0; i < bias.size(); ++i) draw(bias[i], wide_bias[i]);
      for (const int rows : {1, 3, 8, 9, 15}) {
        // The bias in the weights' type, or (odd row counts) the same values in f32.
        const DType bias_type = rows % 2 == 0 ? type : DType::kF32;
        const void* b =
            bias_type == type ? static_cast<const void*>(bias.data()) : wide_bias.data();
        const std::int64_t ldx = in + 16, ldy = out + 3;
        std::vector<float> x(static_cast<std::size_t>(rows * ldx));
        std::normal_distribution<float> normal;
        for (auto& v : x) v = normal(rng);
        std::vector<float> got(static_cast<std::size_t>(rows * ldy), 0.5f), want(got);
        std::vector<float> row(static_cast<std::size_t>(in));
        kernels::linear_rows(x.data(), rows, ldx, in, w.data(), type, bias_type, b, 0, out,
                             got.data(), ldy, true, row.data());
        kernels::linear_rows(x.data(), rows, ldx, in, wide.data(), DType::kF32, DType::kF32,
                             wide_bias.data(), 0, out, want.data(), ldy, true, row.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << rows << " rows";
        // Outputs [o0, o1) alone: the same bits, nothing else written.
        std::vector<float> part(got.size(), 0.5f);
        kernels::linear_rows(x.data(), rows, ldx, in, w.data(), type, bias_type, b, 5, 21,
                             part.data(), ldy, true, row.data());
        for (int t = 0; t < rows; ++t) {
          for (int o = 0; o < out; ++o) {
            const std::size_t at = static_cast<std::size_t>(t * ldy + o);
            ASSERT_EQ(part[at], o >= 5 && o < 21 ? want[at] : 0.5f) << t << ", " << o;
          }
        }
      }
    }
  }
}

// The magnitude of the offset part of each weight of a block (the term not multiplied by the
// block's quantized value: Q4_1's m, Q4_K's dmin * m, Q6_K's 32 * d * scale), which the q8 kernels
// sum apart from the scaled part; 0 where they sum the weight whole (Q8_0, Q4_0).
void offset_magnitudes(std::uint32_t type, const std::uint8_t* b, double* c) {
  const int n = blocks::block_elements(type);
  for (int e = 0; e < n; ++e) c[e] = 0.0;
  if (type == blocks::kQ4_1) {
    for (int e = 0; e < n; ++e) c[e] = std::fabs(blocks::half_to_float(blocks::u16_at(b + 2)));
  } else if (type == blocks::kQ4_K) {
    const double dmin = std::fabs(blocks::half_to_float(blocks::u16_at(b + 2)));
    for (int j = 0; j < 8; ++j) {
      int sc = 0, m = 0;
      blocks::scale_min_k4(j, b + 4, &sc, &m);
      for (int l = 0; l < 32; ++l) c[32 * j + l] = dmin * m;
    }
  } else if (type == blocks::kQ6_K) {
    const double d = std::fabs(blocks::half_to_float(blocks::u16_at(b + 208)));
    for (int e = 0; e < n; ++e)
      c[e] = 32.0 * d * std::abs(static_cast<std::int8_t>(b[192 + e / 16]));
  }
}

// --activations q8: the row quantized to 8 bits per group as documented (the AVX-512 quantizer
// writes the plain loops' bytes), and each output the dot product of the weights with the
// quantized row, within the f32 rounding of its block-by-block sum, by the VNNI kernel (where the
// CPU has it) and the plain loops alike; HostLinear runs it for decode-sized calls only, and
// leaves a type it does not serve (Q5_K) on the exact path.
TEST(HostLinear, Q8ActivationsMultiplyTheQuantizedRow) {
  std::mt19937 rng(11);
  const int in = 1024, out = 37;
  ThreadPool pool(2);
  for (const std::uint32_t type :
       {blocks::kQ8_0, blocks::kQ4_0, blocks::kQ4_1, blocks::kQ4_K, blocks::kQ6_K}) {
    SCOPED_TRACE(ggml_type(type)->name);
    ASSERT_TRUE(kernels::q8_activations_serve(type));
    const int per_block = blocks::block_elements(type);
    const int group = per_block;  // 32, or 256 for the K types
    const std::size_t block_bytes = static_cast<std::size_t>(blocks::block_bytes(type));
    const std::vector<std::uint8_t> w = testing::random_block_matrix(type, out, in, rng);
    std::vector<float> x(in);
    std::normal_distribution<float> normal;
    for (auto& v : x) v = normal(rng);
    for (int e = 256; e < 512; ++e) x[static_cast<std::size_t>(e)] = 0.0f;  // a group of zeros
    x[3] = 40.0f;  // an outlier: its group's step is coarse

    std::vector<std::uint8_t> fast(kernels::q8_activation_bytes(in), 0), plain(fast.size(), 0);
    kernels::quantize_activation_q8(type, x.data(), in, fast.data());
    kernels::quantize_activation_q8(type, x.data(), in, plain.data(), /*portable=*/true);
    ASSERT_EQ(fast, plain);
    std::vector<float> xq(in);
    kernels::dequantize_activation_q8(type, fast.data(), in, xq.data());
    for (int g = 0; g < in / group; ++g) {
      float amax = 0.0f, qmax = 0.0f;
      for (int e = g * group; e < (g + 1) * group; ++e) {
        amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(e)]));
        qmax = std::max(qmax, std::fabs(xq[static_cast<std::size_t>(e)]));
      }
      const double step = amax / 127.0;
      for (int e = g * group; e < (g + 1) * group; ++e) {
        ASSERT_LE(std::fabs(xq[static_cast<std::size_t>(e)] - x[static_cast<std::size_t>(e)]),
                  0.5 * step * (1 + 1e-5))
            << "element " << e;
      }
      EXPECT_NEAR(qmax, amax, amax * 1e-6) << "group " << g;  // the largest is +-127 steps
    }

    std::vector<float> wf(static_cast<std::size_t>(out) * in);
    kernels::dequantize_rows(type, w.data(), out, in, wf.data());
    for (const bool portable : {false, true}) {
      std::vector<float> y(out, 0.5f);
      kernels::linear_row_blocks_q8(fast.data(), in, w.data(), type, DType::kF32, nullptr, 0, out,
                                    y.data(), /*accumulate=*/true, portable);
      const std::size_t row_bytes = static_cast<std::size_t>(in / per_block) * block_bytes;
      for (int o = 0; o < out; ++o) {
        double exact = 0.0, with_x = 0.0, magnitude = 0.0, step_cost = 0.0;
        std::vector<double> c(static_cast<std::size_t>(per_block));
        for (int blk = 0; blk < in / per_block; ++blk) {
          offset_magnitudes(type, &w[o * row_bytes + blk * block_bytes], c.data());
          for (int l = 0; l < per_block; ++l) {
            const std::size_t e = static_cast<std::size_t>(blk * per_block + l);
            const double wv = wf[static_cast<std::size_t>(o) * in + e];
            exact += wv * xq[e];
            with_x += wv * x[e];
            magnitude += (std::fabs(wv) + 2 * c[static_cast<std::size_t>(l)]) * std::fabs(xq[e]);
            step_cost += std::fabs(wv) * std::fabs(xq[e] - x[e]);
          }
        }
        // Each block's parts: the scale product, the integer sum's conversion and the product
        // rounded once each, then at most 2 terms a block and 16 lanes summed.
        const double bound =
            gamma(2 * (in / per_block) + 16 + 3) * magnitude + 2 * kU * (0.5 + std::fabs(exact));
        EXPECT_NEAR(y[static_cast<std::size_t>(o)], 0.5 + exact, bound)
            << "row " << o << (portable ? ", plain loops" : ", vectorized");
        // What quantizing x cost, within sum |w| * step / 2 (checked above element by element).
        EXPECT_LE(std::fabs(exact - with_x), step_cost + 1e-12);
      }
    }

    // Through HostLinear: decode-sized calls (1 and 3 rows) give the kernel's bits row by row.
    HostLinear linear(pool, DType::kF32, in, false, true, /*q8_activations=*/true);
    for (const int rows : {1, 3}) {
      std::vector<float> xs(static_cast<std::size_t>(rows) * in);
      for (auto& v : xs) v = normal(rng);
      std::vector<float> y(static_cast<std::size_t>(rows) * out);
      linear(xs.data(), rows, in, WeightRef{w.data(), type_of_ggml(type)}, nullptr, out, y.data(),
             false);
      for (int t = 0; t < rows; ++t) {
        std::vector<std::uint8_t> q(kernels::q8_activation_bytes(in));
        kernels::quantize_activation_q8(type, xs.data() + static_cast<std::size_t>(t) * in, in,
                                        q.data());
        std::vector<float> alone(out);
        kernels::linear_row_blocks_q8(q.data(), in, w.data(), type, DType::kF32, nullptr, 0, out,
                                      alone.data(), false);
        EXPECT_EQ(std::vector<float>(y.begin() + t * out, y.begin() + (t + 1) * out), alone)
            << rows << " rows, row " << t;
      }
    }
  }
  // Rows with a NaN and an infinity: both quantizers write the same bytes (a NaN becomes -127;
  // an infinite maximum makes the group's step infinite and its finite values 0).
  for (const std::uint32_t type : {blocks::kQ8_0, blocks::kQ4_K, blocks::kQ6_K}) {
    std::vector<float> x(in, 0.5f);
    x[5] = std::nanf("");
    x[300] = INFINITY;
    x[301] = -2.0f;
    std::vector<std::uint8_t> fast(kernels::q8_activation_bytes(in), 0), plain(fast.size(), 0);
    kernels::quantize_activation_q8(type, x.data(), in, fast.data());
    kernels::quantize_activation_q8(type, x.data(), in, plain.data(), /*portable=*/true);
    EXPECT_EQ(fast, plain) << ggml_type(type)->name;
  }
  // Q5_K has no q8 kernel: HostLinear keeps the exact rows for it.
  ASSERT_FALSE(kernels::q8_activations_serve(blocks::kQ5_K));
  const std::vector<std::uint8_t> w = testing::random_block_matrix(blocks::kQ5_K, out, in, rng);
  std::vector<float> x(in), y(out), expected(out), row(in);
  for (auto& v : x) v = std::normal_distribution<float>()(rng);
  HostLinear linear(pool, DType::kF32, in, false, true, /*q8_activations=*/true);
  linear(x.data(), 1, in, WeightRef{w.data(), ElementType::kQ5_K}, nullptr, out, y.data(), false);
  kernels::linear_rows_blocks(x.data(), 1, in, in, w.data(), blocks::kQ5_K, DType::kF32, nullptr, 0,
                              out, expected.data(), out, false, row.data());
  EXPECT_EQ(y, expected);
}

// A matrix carries its element type: one in a dtype other than the weights' is refused, naming
// both, before a byte of it is read as the other; GGUF blocks and the weights' dtype are served.
TEST(HostLinear, AMatrixOfAnotherDtypeIsRefused) {
  ThreadPool pool(1);
  const int in = 64, out = 8;
  std::vector<std::uint16_t> w(static_cast<std::size_t>(out) * in, 0x3c00);  // 1.0 in f16
  std::vector<float> x(in, 1.0f), y(out, 7.0f);
  HostLinear linear(pool, DType::kBF16, in, false, false, false);
  for (const ElementType wrong : {ElementType::kF16, ElementType::kF32}) {
    kvo::testing::expect_error(
        [&] {
          linear(x.data(), 1, in, WeightRef{w.data(), wrong}, nullptr, out, y.data(), false);
        },
        ErrorCode::kInternal, std::string(traits(wrong).name) + " where");
    EXPECT_EQ(y, std::vector<float>(out, 7.0f));
  }
  linear(x.data(), 1, in, WeightRef{w.data(), ElementType::kBF16}, nullptr, out, y.data(), false);
  EXPECT_EQ(y[0], in * bf16_to_float(0x3c00));
}

// A GGUF file's f16 and bf16 matrices kept in an f32 model (the host's WeightLayout): decode rows
// and GEMM tiles (a partial tile of outputs, a partial block of rows) give the bits of the same
// matrix expanded to f32, the bias in f32; a matrix of a K/V-only type is refused.
TEST(HostLinear, KeptHalfMatricesInAnF32ModelMultiplyAsExpanded) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const int in = 208, out = 300;
  HostLinear linear(pool, DType::kF32, in, false, /*blocks=*/true, false, 64);
  std::normal_distribution<float> normal;
  std::vector<float> bias(out);
  for (auto& b : bias) b = normal(rng);
  for (const ElementType type : {ElementType::kF16, ElementType::kBF16}) {
    SCOPED_TRACE(traits(type).name);
    std::vector<std::uint16_t> w(static_cast<std::size_t>(out) * in);
    std::vector<float> wide(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float v = normal(rng) * 0.05f;
      w[i] = type == ElementType::kF16 ? float_to_f16(v) : float_to_bf16(v);
      wide[i] = type == ElementType::kF16 ? f16_to_float(w[i]) : bf16_to_float(w[i]);
    }
    for (const int n : {1, 7, 40}) {  // decode rows; 40: GEMM tiles (kGemmMinRows is 16)
      std::vector<float> x(static_cast<std::size_t>(n) * in);
      for (auto& v : x) v = normal(rng);
      std::vector<float> got(static_cast<std::size_t>(n) * out, 0.25f), want(got);
      linear(x.data(), n, in, WeightRef{w.data(), type}, bias.data(), out, got.data(), true);
      linear(x.data(), n, in, WeightRef{wide.data(), ElementType::kF32}, bias.data(), out,
             want.data(), true);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << n;
    }
  }
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(out) * in);
  std::vector<float> x(in), y(out, 7.0f);
  // Without `blocks` the panels are one row wide: a matrix not in the model dtype is refused.
  HostLinear plain(pool, DType::kF32, in, false, /*blocks=*/false, false, 64);
  kvo::testing::expect_error(
      [&] {
        plain(x.data(), 1, in, WeightRef{bytes.data(), ElementType::kF16}, nullptr, out, y.data(),
              false);
      },
      ErrorCode::kInternal, "a matrix of f16 in an op planned for f32 weights alone");
  for (const ElementType wrong : {ElementType::kInt8, ElementType::kFP8E4M3}) {
    kvo::testing::expect_error(
        [&] {
          linear(x.data(), 1, in, WeightRef{bytes.data(), wrong}, nullptr, out, y.data(), false);
        },
        ErrorCode::kInternal, std::string(traits(wrong).name) + " where");
  }
  EXPECT_EQ(y, std::vector<float>(out, 7.0f));
}

// to_f32 over every f16 code (vcvtph2ps on an AVX-512 CPU, a masked tail of 15): the value
// f16_to_float gives, bit for bit, NaN codes NaN.
TEST(HostKernels, EveryF16CodeWidensExactly) {
  std::vector<std::uint16_t> codes(65535);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint16_t>(i + 1);
  std::vector<float> got(codes.size() + 1, 3.0f);
  kernels::to_f32(codes.data(), DType::kF16, static_cast<std::int64_t>(codes.size()), got.data());
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const float want = f16_to_float(codes[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got[i])) << codes[i];
    } else {
      ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0) << codes[i];
    }
  }
  EXPECT_EQ(got.back(), 3.0f);  // nothing past count written
}

// The q8 GEMM (model/host/host_gemm_q8.hpp) for every type it serves: each block's codes, scales
// and offsets give dequantize_part's bits; the rows quantize as documented (VNNI and plain loops
// write the same bytes); each output is the product of the weights with the quantized rows within
// the f32 rounding of its sub-block sums, with the same bits from the VNNI kernel and the plain
// loops; and HostLinear's GEMM-sized calls with q8 activations give those bits whatever its tasks.
TEST(HostLinear, Q8GemmMultipliesTheQuantizedRows) {
  std::mt19937 rng(12);
  const int in = 512, out = 150, n = 21;
  ThreadPool pool(2);
  for (const std::uint32_t type :
       {blocks::kQ8_0, blocks::kQ4_0, blocks::kQ4_1, blocks::kQ4_K, blocks::kQ5_K, blocks::kQ6_K}) {
    SCOPED_TRACE(ggml_type(type)->name);
    ASSERT_TRUE(q8_gemm::serves(type));
    const int per_block = blocks::block_elements(type);
    const std::size_t block_bytes = static_cast<std::size_t>(blocks::block_bytes(type));
    const std::size_t row_bytes = static_cast<std::size_t>(in / per_block) * block_bytes;
    const std::vector<std::uint8_t> w = testing::random_block_matrix(type, out, in, rng);
    std::vector<float> wf(static_cast<std::size_t>(out) * in);
    kernels::dequantize_rows(type, w.data(), out, in, wf.data());
    // Codes: scale (u - offset) + m, rounded as dequantize_part rounds, gives its bits.
    std::vector<float> offset(wf.size());
    for (int o = 0; o < out; ++o) {
      for (int part = 0; part < in / 32; ++part) {
        const std::uint8_t* b = &w[o * row_bytes + (part * 32 / per_block) * block_bytes];
        std::uint8_t u[32];
        float scale[2] = {0.0f, 0.0f}, m = 0.0f, expected[32];
        blocks::codes_part(type, b, part % (per_block / 32), u, scale, &m);
        blocks::dequantize_part(type, b, part % (per_block / 32), expected);
        for (int l = 0; l < 32; ++l) {
          const float scaled = scale[l / 16] * static_cast<float>(u[l] - blocks::code_offset(type));
          const bool offsets =
              type == blocks::kQ4_1 || type == blocks::kQ4_K || type == blocks::kQ5_K;
          const float value = offsets ? scaled + m : scaled;
          ASSERT_EQ(std::memcmp(&value, &expected[l], 4), 0) << o << " " << part << " " << l;
          offset[static_cast<std::size_t>(o) * in + part * 32 + l] = m;
        }
      }
    }
    std::vector<float> x(static_cast<std::size_t>(n) * in);
    std::normal_distribution<float> normal;
    for (auto& v : x) v = normal(rng);
    for (int e = 64; e < 96; ++e) x[static_cast<std::size_t>(e)] = 0.0f;  // a group of zeros
    x[in + 3] = 40.0f;  // an outlier: its group's step is coarse
    const std::size_t stride = q8_gemm::activation_row_bytes(type, in);
    std::vector<std::uint8_t> xq(n * stride, 0), plain(n * stride, 0);
    std::vector<double> xd(x.size());  // the values the quantized rows stand for
    for (int t = 0; t < n; ++t) {
      const float* xt = x.data() + static_cast<std::ptrdiff_t>(t) * in;
      q8_gemm::quantize_row(type, xt, in, xq.data() + t * stride);
      q8_gemm::quantize_row(type, xt, in, plain.data() + t * stride, /*portable=*/true);
      std::vector<float> d(in / 32);
      std::vector<std::int32_t> sums(in / 16);
      std::vector<std::int8_t> q(in);
      kernels::quantize_q8_groups(xt, in, 32, 16, false, d.data(), sums.data(), q.data());
      for (int e = 0; e < in; ++e) {
        xd[static_cast<std::size_t>(t) * in + e] = static_cast<double>(d[e / 32]) * q[e];
        ASSERT_LE(std::fabs(xd[static_cast<std::size_t>(t) * in + e] - xt[e]),
                  0.5 * d[e / 32] * (1 + 1e-5))
            << t << " " << e;
      }
    }
    ASSERT_EQ(xq, plain);

    std::vector<std::uint8_t> panel(q8_gemm::panel_bytes(type, out, in));
    q8_gemm::pack(type, w.data(), out, in, panel.data());
    std::vector<float> bias(out);
    for (auto& v : bias) v = normal(rng);
    std::vector<float> y_plain(static_cast<std::size_t>(n) * out, 0.5f);
    q8_gemm::multiply(type, panel.data(), out, in, xq.data(), n, DType::kF32, bias.data(), 0,
                      y_plain.data(), out, /*accumulate=*/true, /*portable=*/true);
    if (q8_gemm::available()) {
      std::vector<float> y_vnni(y_plain.size(), 0.5f);
      q8_gemm::multiply(type, panel.data(), out, in, xq.data(), n, DType::kF32, bias.data(), 0,
                        y_vnni.data(), out, true);
      ASSERT_EQ(std::memcmp(y_vnni.data(), y_plain.data(), y_plain.size() * 4), 0);
    }
    const int subs = in / (type == blocks::kQ6_K ? 16 : 32);
    for (int t = 0; t < n; ++t) {
      for (int o = 0; o < out; ++o) {
        double exact = 0.0, magnitude = 0.0;
        for (int e = 0; e < in; ++e) {
          const std::size_t we = static_cast<std::size_t>(o) * in + e;
          const double xv = xd[static_cast<std::size_t>(t) * in + e];
          exact += wf[we] * xv;
          magnitude += (std::fabs(wf[we]) + 2 * std::fabs(offset[we])) * std::fabs(xv);
        }
        // Per sub-block: the product with d, then one or two fused steps into the sum; then the
        // bias and the accumulated value.
        const double want = 0.5 + (exact + bias[o]);
        const double bound = gamma(3 * subs) * magnitude + 2 * kU * (1.0 + std::fabs(want));
        ASSERT_NEAR(y_plain[static_cast<std::size_t>(t) * out + o], want, bound) << t << " " << o;
      }
    }

    // HostLinear, q8 activations: calls of kGemmMinRows rows and more go through the q8 GEMM where
    // the CPU has VNNI, in tasks of 64 outputs, with the bits of one panel of every row.
    HostLinear linear(pool, DType::kF32, in, false, true, /*q8_activations=*/true, n);
    for (const int rows : {HostLinear::kGemmMinRows, n}) {
      std::vector<float> y(static_cast<std::size_t>(rows) * out);
      linear(x.data(), rows, in, WeightRef{w.data(), type_of_ggml(type)}, bias.data(), out,
             y.data(), false);
      if (!q8_gemm::available()) continue;  // the f32 panel instead: MatchesFloat64's bound
      std::vector<float> alone(y.size());
      q8_gemm::multiply(type, panel.data(), out, in, xq.data(), rows, DType::kF32, bias.data(), 0,
                        alone.data(), out, false, true);
      EXPECT_EQ(std::memcmp(y.data(), alone.data(), y.size() * 4), 0) << rows << " rows";
    }
  }
}

// Q8_0 as ggml's reference quantizes it: d = max |x| / 127 stored as f16, q = round(x / d) with
// halves away from zero and 1/d taken before d is rounded; an all-zero block has d = 0, q = 0.
TEST(HostLinear, Q8_0QuantizesAsTheReference) {
  std::vector<float> x(64, 0.0f);
  for (int i = 0; i < 32; ++i) x[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i - 16);
  x[5] = -12.7f;  // the largest magnitude: d = 0.1, which f16 rounds
  std::vector<std::uint8_t> q(68);
  quantize_q8_0(x.data(), 64, q.data());
  const float d = blocks::half_to_float(blocks::u16_at(q.data()));
  EXPECT_EQ(blocks::u16_at(q.data()), 0x2e66);  // fp16(0.1f): the nearest half to 0.1
  const float id = 1.0f / (12.7f / 127.0f);
  for (int i = 0; i < 32; ++i) {
    const auto got = static_cast<std::int8_t>(q[static_cast<std::size_t>(2 + i)]);
    EXPECT_EQ(got, static_cast<int>(std::round(x[static_cast<std::size_t>(i)] * id))) << i;
    EXPECT_NEAR(got * d, x[static_cast<std::size_t>(i)], 0.0501f) << i;
  }
  EXPECT_EQ(static_cast<std::int8_t>(q[2 + 5]), -127);
  EXPECT_EQ(static_cast<std::int8_t>(q[2 + 17]), 5);  // 0.5 / 0.1 = 5 exactly
  for (int i = 34; i < 68; ++i) EXPECT_EQ(q[static_cast<std::size_t>(i)], 0) << i;
}

// int8 per output channel: every block of a row carries the row's scale d = max |row| / 127 as
// f16, q = round(x / d) with 1/d taken before d is rounded (so the row's largest magnitude is
// +-127), and the weight d16 * q lies within d / 2 + 127 e of x, e = |d16 - d| <= f16's half ulp
// (max(d 2^-11, 2^-25): row 1's scale is subnormal in f16). Rows of very different magnitudes
// keep their own scales; an all-zero row has d = 0, q = 0.
TEST(HostLinear, Int8QuantizesPerOutputChannel) {
  std::mt19937 rng(11);
  const int rows = 6, cols = 96, per_row = cols / 32;
  std::vector<float> x = random_floats(static_cast<std::size_t>(rows) * cols, rng);
  for (int c = 0; c < cols; ++c) {
    x[static_cast<std::size_t>(1 * cols + c)] *= 1e-3f;
    x[static_cast<std::size_t>(2 * cols + c)] *= 300.0f;
    x[static_cast<std::size_t>(4 * cols + c)] = 0.0f;
  }
  x[static_cast<std::size_t>(3 * cols + 70)] = -40.0f;  // one large weight in a late block
  std::vector<std::uint8_t> q(static_cast<std::size_t>(rows * per_row) * 34, 0xa5);
  quantize_int8_rows(x.data(), rows, cols, q.data());
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<std::ptrdiff_t>(r) * cols;
    float amax = 0;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float id = amax != 0.0f ? 1.0f / (amax / 127.0f) : 0.0f;
    const std::uint8_t* first = q.data() + static_cast<std::ptrdiff_t>(r) * per_row * 34;
    const float d = blocks::half_to_float(blocks::u16_at(first));
    const float exact = amax / 127.0f, e = std::max(exact * 0x1p-11f, 0x1p-25f);
    EXPECT_NEAR(d, exact, e) << r;
    int largest = 0;
    for (int c = 0; c < cols; ++c) {
      const std::uint8_t* block = first + (c / 32) * 34;
      ASSERT_EQ(blocks::u16_at(block), blocks::u16_at(first)) << r << " " << c;
      const auto got = static_cast<std::int8_t>(block[2 + c % 32]);
      EXPECT_EQ(got, static_cast<int>(std::round(row[c] * id))) << r << " " << c;
      EXPECT_LE(std::fabs(got * d - row[c]), exact * 0.5001f + 127 * e) << r << " " << c;
      largest = std::max(largest, std::abs(static_cast<int>(got)));
    }
    EXPECT_EQ(largest, r == 4 ? 0 : 127) << r;
  }
  // The same bytes through the matrix entry point; per block, a row's blocks differ.
  std::vector<std::uint8_t> again(q.size()), per_block(q.size());
  quantize_q8_0_matrix(x.data(), rows, cols, Q8Scales::kPerRow, again.data());
  quantize_q8_0_matrix(x.data(), rows, cols, Q8Scales::kPerBlock, per_block.data());
  EXPECT_EQ(again, q);
  std::vector<std::uint8_t> reference(q.size());
  quantize_q8_0(x.data(), rows * cols, reference.data());
  EXPECT_EQ(per_block, reference);
  EXPECT_NE(per_block, q);
}

TEST(HostLinear, DecodeRowsGetTheBitsTheyGetAlone) {
  std::mt19937 rng(2);
  const int in = 96, out = 70, n = HostLinear::kGemmMinRows - 1;
  for (DType type : kTypes) {
    const Values w = random_values(static_cast<std::size_t>(out) * in, type, 0.5f, rng);
    HostOps ops(shape_of(attention_config(2, 1, 48, 0), type, n, n, 16, 2));
    const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * in, rng);
    std::vector<float> together(static_cast<std::size_t>(n) * out);
    ops.linear(x.data(), n, in, WeightRef{w.bytes.data(), element_type(type)}, nullptr, out,
               together.data(), false);
    for (int t = 0; t < n; ++t) {
      std::vector<float> alone(out);
      ops.linear(x.data() + t * in, 1, in, WeightRef{w.bytes.data(), element_type(type)}, nullptr,
                 out, alone.data(), false);
      ASSERT_EQ(std::memcmp(alone.data(), together.data() + t * out, out * sizeof(float)), 0)
          << "row " << t;
    }
  }
}

// ---- attention -------------------------------------------------------------------------------

CacheConfig cache_config(const ModelConfig& c, DType dtype, int slots, int max_seq) {
  CacheConfig cache;
  cache.layers = 1;
  cache.slots = slots;
  cache.max_seq = max_seq;
  cache.kv_heads = c.kv_heads;
  cache.head_dim = c.head_dim;
  cache.dtype = dtype;
  return cache;
}

// A cache layer of `slots` x `max_seq` tokens with a padded head stride, so that the view's
// strides are not the packed ones: [slot][token][kv_head][head_stride >= head_dim].
struct Layer {
  Values k, v;
  LayerView view;
};
Layer random_layer(const ModelConfig& c, DType type, int slots, int max_seq, std::mt19937& rng) {
  const int head_stride = c.head_dim + 8;
  const std::size_t n = static_cast<std::size_t>(slots) * max_seq * c.kv_heads * head_stride;
  Layer l;
  l.k = random_values(n, type, 1.5f, rng);
  l.v = random_values(n, type, 1.0f, rng);
  l.view = LayerView::of(kv_layout(cache_config(c, type, slots, max_seq)), l.k.bytes.data(),
                         l.v.bytes.data());
  l.view.head_stride = head_stride;
  l.view.token_stride = static_cast<std::int64_t>(c.kv_heads) * head_stride;
  l.view.slot_stride = l.view.token_stride * max_seq;
  l.view.v_head_stride = l.view.head_stride;
  l.view.v_token_stride = l.view.token_stride;
  l.view.v_slot_stride = l.view.slot_stride;
  return l;
}

// Softmax-weighted values in double, and the float32 bound of each, for n keys:
//   score j = scale q.k_j: off by scale (gamma_(d+1) sum |q||k| + sum |q| e_k) (e_k: a quantized
//             key's dequantization, u |k|);
//   weight j = exp(s_j - max) / sum: a score error moves it by pi_j (e_s_j + E_s), E_s =
//             sum pi_l e_s_l; its own rounding is at most u (10 + 2 blocks + 2 |s_j - max|)
//             relative (expf to 2 ulp, its argument, one rescale per key block or decode part);
//   out = sum pi_j v_j: gamma_n for the weighted sum and gamma_n for the normalising sum, each of
//             |pi| |v|; the value's own dequantization, pi_j e_v_j; the last divide, u |out|.
// int8 rows through the VNNI kernel (attend_keys_int8_vnni) add, for the query rounded to 16 bits
// (a step of max|q| / 32767), sum |k| max|q| / 65534 to each dot's error; and for weights rounded
// to 16 bits per block of 16 keys (a step of the block's largest pi_l s_l / 32767, s_l the value
// row's scale, max|v_l| / 127), half a step times |v_j| / s_j for each key j, the block's largest
// taken over the 31 keys around j (any block that holds j lies there).
struct Attended {
  std::vector<double> value, bound;
};

Attended softmax_weighted(const std::vector<double>& dots, const std::vector<double>& dot_errors,
                          double scale, const std::vector<const float*>& values,
                          const std::vector<double>& value_errors_scale, int d,
                          const std::vector<double>* value_scales = nullptr) {
  const int n = static_cast<int>(dots.size());
  const int blocks = n / 64 + 3;
  std::vector<double> s(dots.size()), es(dots.size()), p(dots.size());
  double m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    s[j] = scale * dots[j];
    es[j] = scale * dot_errors[j];
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += p[j] = std::exp(s[j] - m);
  double score_error = 0;
  for (int j = 0; j < n; ++j) {
    p[j] /= sum;
    score_error += p[j] * es[j];
  }
  // The weights' 16-bit step around key j, over |v_j| / s_j (VNNI int8 rows).
  std::vector<double> weight_step(dots.size(), 0);
  if (value_scales != nullptr) {
    for (int j = 0; j < n; ++j) {
      double largest = 0;
      for (int l = std::max(0, j - 15); l <= std::min(n - 1, j + 15); ++l) {
        largest = std::max(largest, p[l] * (*value_scales)[l]);
      }
      const double s_j = (*value_scales)[j];
      weight_step[j] = s_j > 0 ? 1.01 * 0.5 * largest / 32767 / s_j : 0;
    }
  }
  Attended a;
  a.value.assign(static_cast<std::size_t>(d), 0);
  a.bound.assign(static_cast<std::size_t>(d), 0);
  for (int e = 0; e < d; ++e) {
    double weighted = 0;
    for (int j = 0; j < n; ++j) {
      const double v = values[j][e];
      a.value[e] += p[j] * v;
      weighted += p[j] * std::fabs(v);
      const double rounding = kU * (10 + 2 * blocks + 2 * std::fabs(s[j] - m));
      a.bound[e] += p[j] * std::fabs(v) * (es[j] + score_error + rounding) +
                    p[j] * value_errors_scale[j] * std::fabs(v) + weight_step[j] * std::fabs(v);
    }
    a.bound[e] += 2 * gamma(n) * weighted + 2 * kU * std::fabs(a.value[e]);
  }
  return a;
}

// out [heads][head_dim] of one query row at `pos` of `slot`, in double, with its float32 bound.
// `dequantized`: K and V are quantized rows, whose values the kernels compute as code * scale (u
// relative each). `vnni`: int8 rows decoded by attend_keys_int8_vnni (vnni_decode).
Attended reference_attention(const ModelConfig& c, const Layer& l, const float* q, int slot,
                             int pos, bool dequantized = false, bool vnni = false) {
  const int d = c.head_dim, group = c.heads / c.kv_heads;
  Attended out;
  const int first = first_key(c.sliding_window, pos);
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int h = 0; h < c.heads; ++h) {
    const int g = h / group;
    std::vector<double> dots, errors, value_errors, value_scales;
    std::vector<const float*> values;
    double q_largest = 0;
    for (int e = 0; e < d; ++e) q_largest = std::max(q_largest, std::fabs(double{q[h * d + e]}));
    for (int j = first; j <= pos; ++j) {
      const std::int64_t at =
          slot * l.view.slot_stride + j * l.view.token_stride + g * l.view.head_stride;
      double dot = 0, magnitude = 0, dequantization = 0;
      for (int e = 0; e < d; ++e) {
        const double term = static_cast<double>(q[h * d + e]) * l.k.exact[at + e];
        dot += term;
        magnitude += std::fabs(term);
        if (dequantized) dequantization += kU * std::fabs(term);
      }
      double k_sum = 0, v_largest = 0;
      for (int e = 0; e < d; ++e) {
        k_sum += std::fabs(double{l.k.exact[at + e]});
        v_largest = std::max(v_largest, std::fabs(double{l.v.exact[at + e]}));
      }
      dots.push_back(dot);
      errors.push_back(gamma(d + 1) * magnitude + dequantization +
                       (vnni ? 1.01 * k_sum * q_largest / 65534 : 0));
      values.push_back(l.v.exact.data() + at);
      value_errors.push_back(dequantized ? kU : 0);
      value_scales.push_back(v_largest / 127);
    }
    const Attended a = softmax_weighted(dots, errors, scale, values, value_errors, d,
                                        vnni ? &value_scales : nullptr);
    out.value.insert(out.value.end(), a.value.begin(), a.value.end());
    out.bound.insert(out.bound.end(), a.bound.begin(), a.bound.end());
  }
  return out;
}

void expect_near(const float* got, const Attended& want, const std::string& what) {
  for (std::size_t i = 0; i < want.value.size(); ++i) {
    ASSERT_NEAR(got[i], want.value[i], want.bound[i]) << what << " element " << i;
  }
}

// Whether decode attends rows of `type` with attend_keys_int8_vnni on this CPU.
bool vnni_decode(const ModelConfig& c, DType type) {
  return kvo::attend::avx512_vnni_rows(type, c.head_dim, c.heads / c.kv_heads);
}

// Several query and key blocks, a chunk that starts after rows already held, GQA groups of 3,
// a head_dim that is not a multiple of the vector width, with and without a sliding window.
TEST(HostAttention, PrefillMatchesFloat64) {
  std::mt19937 rng(3);
  for (DType type : kTypes) {
    for (int window : {0, 100}) {
      const ModelConfig c = attention_config(6, 2, 40, window);
      const int slots = 2, max_seq = 400, slot = 1, first_position = 130, n = 150;
      Layer l = random_layer(c, type, slots, max_seq, rng);
      HostOps ops(shape_of(c, type, n, slots, max_seq, 2));
      const std::vector<float> q = random_floats(static_cast<std::size_t>(n) * c.q_dim(), rng);
      std::vector<float> out(q.size());
      ops.attention_prefill(q.data(), n, slot, first_position, c.sliding_window, l.view,
                            out.data());
      for (int i = 0; i < n; i += 7) {
        const auto want =
            reference_attention(c, l, q.data() + i * c.q_dim(), slot, first_position + i);
        expect_near(out.data() + i * c.q_dim(), want,
                    "dtype " + std::to_string(static_cast<int>(type)) + " window " +
                        std::to_string(window) + " row " + std::to_string(i));
      }
    }
  }
}

// Rows of different slots and lengths, some split into many parts of keys.
TEST(HostAttention, DecodeMatchesFloat64) {
  std::mt19937 rng(4);
  for (DType type : kTypes) {
    // head_dim 64 takes the AVX-512 kernel where the CPU has one, 40 the portable one.
    for (auto [window, head_dim] : {std::pair{0, 64}, {700, 64}, {0, 40}}) {
      const ModelConfig c = attention_config(8, 2, head_dim, window);
      const int slots = 3, max_seq = 3000;
      Layer l = random_layer(c, type, slots, max_seq, rng);
      HostOps ops(shape_of(c, type, 4, 4, max_seq, 3));
      const std::vector<std::int32_t> row_slots = {2, 0, 1, 0};
      const std::vector<std::int32_t> positions = {2999, 0, 1234, 300};
      ASSERT_GT(HostAttention::split(3000).parts, 4);
      const std::vector<float> q = random_floats(4 * static_cast<std::size_t>(c.q_dim()), rng);
      std::vector<float> out(q.size());
      DecodeRows rows;
      rows.host_slots = row_slots.data();
      rows.host_positions = positions.data();
      ops.attention_decode(q.data(), 4, rows, c.sliding_window, l.view, out.data());
      for (int i = 0; i < 4; ++i) {
        const auto want =
            reference_attention(c, l, q.data() + i * c.q_dim(), row_slots[i], positions[i]);
        expect_near(out.data() + i * c.q_dim(), want,
                    "dtype " + std::to_string(static_cast<int>(type)) + " window " +
                        std::to_string(window) + " head_dim " + std::to_string(head_dim) + " row " +
                        std::to_string(i));
      }
    }
  }
}

// A layer of quantized rows (kvoffload/quant.hpp) drawn at random, laid out as the cache lays
// them out; `exact` holds each element's dequantized value at the element's index, so the float64
// reference reads it through the same strides.
Layer quantized_layer(const ModelConfig& c, DType dtype, int slots, int max_seq,
                      std::mt19937& rng) {
  const std::int64_t row_bytes = static_cast<std::int64_t>(quant_row_bytes(c.kv_heads, c.head_dim));
  const std::size_t n = static_cast<std::size_t>(slots) * max_seq * row_bytes;
  Layer l;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(c.kv_dim()));
  std::vector<float> back(x.size());
  for (Values* t : {&l.k, &l.v}) {
    t->bytes.assign(n, 0);
    t->exact.assign(n, 0.0f);
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(slots) * max_seq; ++r) {
      for (int g = 0; g < c.kv_heads; ++g) {
        const float spread = 0.5f + static_cast<float>(rng() % 4);  // heads of different ranges
        for (int e = 0; e < c.head_dim; ++e)
          x[static_cast<std::size_t>(g * c.head_dim + e)] = normal(rng) * spread;
      }
      std::uint8_t* row = t->bytes.data() + r * row_bytes;
      quantize_row(x.data(), c.kv_heads, c.head_dim, dtype, row);
      dequantize_row(row, c.kv_heads, c.head_dim, dtype, back.data());
      std::copy(back.begin(), back.end(), t->exact.begin() + r * row_bytes);
    }
  }
  l.view = LayerView::of(kv_layout(cache_config(c, dtype, slots, max_seq)), l.k.bytes.data(),
                         l.v.bytes.data());
  EXPECT_EQ(l.view.token_stride, row_bytes);  // packed rows: the layout's own strides
  return l;
}

// Attention over quantized rows equals attention over their dequantized values: prefill and
// decode, fp8 and int8, heads of 3 elements padded before their scales, a window.
TEST(HostAttention, QuantizedRowsAttendAsTheirValues) {
  std::mt19937 rng(21);
  for (DType dtype : {DType::kFP8E4M3, DType::kInt8}) {
    for (auto [window, head_dim, kv_heads] : {std::tuple{0, 64, 2}, {90, 40, 2}, {0, 6, 3}}) {
      const ModelConfig c = attention_config(6, kv_heads, head_dim, window);
      const int slots = 2, max_seq = 600;
      Layer l = quantized_layer(c, dtype, slots, max_seq, rng);
      OpsShape shape = shape_of(c, DType::kF32, 160, 3, max_seq, 2);
      shape.kv_dtype = dtype;
      HostOps ops(shape);
      const std::string what = std::string(dtype_name(dtype)) + " head_dim " +
                               std::to_string(head_dim) + " window " + std::to_string(window);
      // prefill: a chunk of 160 after 300 rows of slot 1
      const int n = 160, first_position = 300;
      const std::vector<float> q = random_floats(static_cast<std::size_t>(n) * c.q_dim(), rng);
      std::vector<float> out(q.size());
      ops.attention_prefill(q.data(), n, 1, first_position, c.sliding_window, l.view, out.data());
      for (int i = 0; i < n; i += 9) {
        expect_near(
            out.data() + i * c.q_dim(),
            reference_attention(c, l, q.data() + i * c.q_dim(), 1, first_position + i, true),
            what + " prefill row " + std::to_string(i));
      }
      // decode: three rows, one long enough to split into parts
      const std::vector<std::int32_t> row_slots = {1, 0, 1};
      const std::vector<std::int32_t> positions = {599, 0, 77};
      DecodeRows rows;
      rows.host_slots = row_slots.data();
      rows.host_positions = positions.data();
      std::vector<float> dout(3 * static_cast<std::size_t>(c.q_dim()));
      ops.attention_decode(q.data(), 3, rows, c.sliding_window, l.view, dout.data());
      for (int i = 0; i < 3; ++i) {
        expect_near(dout.data() + i * c.q_dim(),
                    reference_attention(c, l, q.data() + i * c.q_dim(), row_slots[i], positions[i],
                                        true, vnni_decode(c, dtype)),
                    what + " decode row " + std::to_string(i));
      }
    }
  }
}

// Split attention (Ops::attention_decode_split): a row's keys before its slot's split row are
// read from the host store (view.host_k, host_v), the others from the view, and the parts merge
// by their log-sum-exps. The view's rows before each split hold NaN here (a split step does not
// prefetch them), so one read shows. Every cache dtype, GQA groups 1, 4 and 8, three slots of
// different lengths, the split at 0, 1, a part edge (256 keys), length - 1 and length. Against
// float64 with DecodeMatchesFloat64's bound plus the merge's own rounding: a part's log-sum-exp,
// (max + ln sum) log2 e, is off by at most u (|max| + |ln sum| + 3) in natural units, and a merge
// weight 2^(lse - m) / (2^(lse_a - m) + 2^(lse_b - m)) moves by twice that relative from its
// arguments and by 4u more from exp2f and the divide: 4u (L + 4) relative on every weight, L the
// largest |max| + |ln sum| of the row (at most its largest |score| + ln of its keys), hence
// 4u (L + 4) max|v| on every element.
TEST(HostAttention, SplitDecodeMatchesFloat64) {
  std::mt19937 rng(9);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kInt8, DType::kFP8E4M3}) {
    for (int group : {1, 4, 8}) {
      const ModelConfig c = attention_config(8, 8 / group, 64, 0);
      const int slots = 3, max_seq = 1100;
      const bool quantized = is_quantized(type);
      Layer l = quantized ? quantized_layer(c, type, slots, max_seq, rng)
                          : random_layer(c, type, slots, max_seq, rng);
      OpsShape shape = shape_of(c, quantized ? DType::kF32 : type, 4, slots, max_seq, 3);
      shape.kv_dtype = type;
      HostOps ops(shape);
      const std::vector<std::int32_t> row_slots = {2, 0, 1};
      const std::vector<std::int32_t> positions = {1099, 300, 17};  // keys before each row
      DecodeRows rows;
      rows.host_slots = row_slots.data();
      rows.host_positions = positions.data();
      const std::vector<float> q = random_floats(3 * static_cast<std::size_t>(c.q_dim()), rng);
      const std::size_t elem = quantized ? 1 : elem_size(type);
      for (int pick = 0; pick < 5; ++pick) {
        std::vector<std::int32_t> split(static_cast<std::size_t>(slots), 0);
        for (int i = 0; i < 3; ++i) {
          const int len = positions[static_cast<std::size_t>(i)];
          const int at[] = {0, 1, 256, len - 1, len};
          split[static_cast<std::size_t>(row_slots[static_cast<std::size_t>(i)])] =
              std::clamp(at[pick], 0, len);
        }
        // The staged copy: rows before each split are NaN.
        std::vector<unsigned char> k = l.k.bytes, v = l.v.bytes;
        for (int s = 0; s < slots; ++s) {
          for (int t = 0; t < split[static_cast<std::size_t>(s)]; ++t) {
            const std::int64_t at = (s * l.view.slot_stride + t * l.view.token_stride) *
                                    static_cast<std::int64_t>(elem);
            const auto bytes = static_cast<std::size_t>(l.view.token_stride) * elem;
            std::memset(k.data() + at, 0xff, bytes);
            std::memset(v.data() + at, 0xff, bytes);
          }
        }
        LayerView view = l.view;
        view.k = k.data();
        view.v = v.data();
        view.split_rows = split.data();
        view.host_k = l.k.bytes.data();
        view.host_v = l.v.bytes.data();
        std::vector<float> out(q.size());
        ops.attention_decode_split(q.data(), 3, rows, 0, view, out.data());
        for (int i = 0; i < 3; ++i) {
          const float* qi = q.data() + i * c.q_dim();
          Attended want = reference_attention(c, l, qi, row_slots[i], positions[i], quantized,
                                              vnni_decode(c, type));
          // L and max|v| of the row, in double.
          const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
          double largest = 0, vmax = 0;
          for (int h = 0; h < c.heads; ++h) {
            const int g = h / group;
            for (int j = 0; j <= positions[i]; ++j) {
              const std::int64_t at = row_slots[i] * l.view.slot_stride + j * l.view.token_stride +
                                      g * l.view.head_stride;
              double dot = 0;
              for (int e = 0; e < c.head_dim; ++e) {
                dot += static_cast<double>(qi[h * c.head_dim + e]) * l.k.exact[at + e];
                vmax = std::max(vmax, std::fabs(static_cast<double>(l.v.exact[at + e])));
              }
              largest = std::max(largest, std::fabs(scale * dot));
            }
          }
          const double merge = 4 * kU * (largest + std::log(positions[i] + 1.0) + 4) * vmax;
          for (double& b : want.bound) b += merge;
          expect_near(out.data() + i * c.q_dim(), want,
                      std::string(dtype_name(type)) + " group " + std::to_string(group) +
                          " split pick " + std::to_string(pick) + " row " + std::to_string(i));
        }
      }
    }
  }
}

// The rate split attention's kAuto takes for the host (the decoder measures it so): decode's own
// bytes per second over a slot of rows, positive and finite for every cache type, and no more
// than the bytes could be read by a plain loop in that time many times over (a rate from a timer
// that never ran would be infinite or 0).
TEST(HostAttention, MeasuresItsOwnRate) {
  ThreadPool pool(2);
  for (DType type : {DType::kBF16, DType::kF32, DType::kInt8}) {
    const double rate =
        HostAttention::measure_rate(attention_config(8, 2, 64, 0), type, pool, 4ull << 20);
    EXPECT_GT(rate, 1e8) << dtype_name(type);
    EXPECT_LT(rate, 1e13) << dtype_name(type);
  }
}

// to_cache_rows writes a quantized cache's rows exactly as quantize_row does.
TEST(HostOps, QuantizedCacheRowsAreQuantizeRowsBytes) {
  std::mt19937 rng(8);
  const ModelConfig c = attention_config(6, 3, 6, 0);
  for (DType dtype : {DType::kFP8E4M3, DType::kInt8}) {
    OpsShape shape = shape_of(c, DType::kBF16, 37, 1, 64, 3);
    shape.kv_dtype = dtype;
    HostOps ops(shape);
    const int n = 37;
    const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * c.kv_dim(), rng);
    const std::size_t row = quant_row_bytes(c.kv_heads, c.head_dim);
    std::vector<std::uint8_t> got(n * row, 0xee), want(n * row, 0x11);
    ops.to_cache_rows(x.data(), n, got.data());
    for (int i = 0; i < n; ++i) {
      quantize_row(x.data() + i * c.kv_dim(), c.kv_heads, c.head_dim, dtype, want.data() + i * row);
    }
    EXPECT_EQ(got, want) << dtype_name(dtype);
  }
}

// int8 and fp8 rows read in place by the AVX-512 kernel (each key's scale on its score, each
// value's on its weight; fp8 exactly, through byte tables with VBMI, else through f16) against the
// portable kernel over the same rows dequantized to f32, continuing a state across calls, groups of
// 3 and 5 (one and two passes of 4 rows, padded) and a short last block, head_dim 32, 96 (64 + 32
// columns) and 128, with and without a soft cap. Where the CPU has VNNI the dispatch takes
// attend_keys_int8_vnni for int8 rows (the same bits as calling it) and multiplies in 16-bit
// integers: the portable kernel then takes the query as rounded to 16 bits (each row's largest to
// 32767, to nearest even), and the weights rounded to 16 bits per block move the output by at most
// 8 / 32767 of the largest |v| (16 keys a block, half a step each); values near 1e-36 keep their
// sign and size. Where the CPU has VBMI the dispatch takes attend_keys_fp8_vbmi for fp8 rows (the
// same bits as calling it). A query row holding a NaN gives NaN, as the f32 path does, and leaves
// the other rows as they were; so does fp8's NaN code in a key.
TEST(HostAttention, DecodeKernelReadsQuantizedRowsInPlace) {
  if (!kernels::have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const int kv_heads = 2, keys = 45;
  for (const DType type : {DType::kInt8, DType::kFP8E4M3})
    for (const int group : {3, 5})
      for (const int d : {32, 96, 128})
        for (const float cap : {0.0f, 2.0f}) {
          const bool vnni = kvo::attend::avx512_vnni_rows(type, d, group);
          const auto row_bytes = static_cast<std::int64_t>(quant_row_bytes(kv_heads, d));
          const auto scale_offset = static_cast<std::int64_t>(quant_scale_offset(kv_heads, d));
          std::vector<std::uint8_t> k(static_cast<std::size_t>(keys * row_bytes));
          std::vector<std::uint8_t> v(k.size());
          std::vector<float> k_exact(static_cast<std::size_t>(keys) * kv_heads * d),
              v_exact(k_exact.size());
          std::vector<float> row(static_cast<std::size_t>(kv_heads) * d);
          for (int j = 0; j < keys; ++j) {
            for (auto* pair : {&k, &v}) {
              for (auto& x : row) x = dist(rng) * static_cast<float>(j % 5 + 1);  // scales differ
              quantize_row(row.data(), kv_heads, d, type, pair->data() + j * row_bytes);
              dequantize_row(pair->data() + j * row_bytes, kv_heads, d, type,
                             (pair == &k ? k_exact : v_exact).data() + j * row.size());
            }
          }
          std::vector<float> q = random_floats(static_cast<std::size_t>(kv_heads) * group * d, rng);
          std::vector<float> kv(kernels::kKeyBlock * kv_heads * d), scores(kv_heads * group * 16);
          auto run = [&](auto kernel, const std::vector<float>& query, const void* kb,
                         const void* vb, std::int64_t stride, DType rows_type, std::int64_t elem) {
            std::vector<SoftmaxState> state(kv_heads * group);
            std::vector<float> acc(query.size(), 0.0f);
            for (const auto& [first, count] : {std::pair{0, 20}, std::pair{20, keys - 20}}) {
              const auto* kp = static_cast<const std::uint8_t*>(kb) + first * stride * elem;
              const auto* vp = static_cast<const std::uint8_t*>(vb) + first * stride * elem;
              const kernels::KeyRows kr{kp, stride, d, rows_type, scale_offset};
              const kernels::KeyRows vr{vp, stride, d, rows_type, scale_offset};
              kernel(query.data(), kv_heads, group, d, kr, vr, count, state.data(), acc.data(),
                     kv.data(), scores.data(), cap);
            }
            for (std::size_t r = 0; r < state.size(); ++r) {
              for (int e = 0; e < d; ++e) acc[r * d + e] /= state[r].sum;
            }
            return acc;
          };
          std::vector<float> q_taken = q;  // the query as the kernel multiplies it
          if (vnni) {
            for (std::size_t r = 0; r < q.size() / static_cast<std::size_t>(d); ++r) {
              float largest = 0;
              for (int e = 0; e < d; ++e) largest = std::max(largest, std::fabs(q[r * d + e]));
              for (int e = 0; e < d; ++e) {
                const float steps = std::nearbyint(q[r * d + e] * (32767.0f / largest));
                q_taken[r * d + e] = steps * (largest / 32767.0f);
              }
            }
          }
          const std::vector<float> want = run(kernels::attend_keys, q_taken, k_exact.data(),
                                              v_exact.data(), kv_heads * d, DType::kF32, 4);
          const std::vector<float> got =
              run(kernels::attend_keys_avx512, q, k.data(), v.data(), row_bytes, type, 1);
          double v_largest = 0;
          for (const float x : v_exact) v_largest = std::max(v_largest, std::fabs(double{x}));
          // The kernels sum each score in their own order: 4e-5 relative covers scores of some tens
          // (keys up to 10 in size) at head_dim 96-128, the rigorous bound being far looser.
          const double slack = vnni ? 1.01 * 8 / 32767 * v_largest : 0;
          for (std::size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], 4e-5 * (1 + std::fabs(want[i])) + slack)
                << dtype_name(type) << " " << i << " d " << d << " group " << group << " cap "
                << cap << (vnni ? " (VNNI)" : "");
          }
          if (vnni) {  // the dispatch took VNNI: the f32 path's bits would differ
            ASSERT_EQ(
                run(kvo::attend::attend_keys_int8_vnni, q, k.data(), v.data(), row_bytes, type, 1),
                got)
                << "d " << d << " group " << group;
            // Values near 1e-36: the weights' largest far below 2^-60, still rounded with their
            // sign.
            std::vector<std::uint8_t> tiny(v.size());
            std::vector<float> tiny_exact(v_exact.size());
            for (int j = 0; j < keys; ++j) {
              for (std::size_t e = 0; e < row.size(); ++e)
                row[e] = v_exact[j * row.size() + e] * 1e-36f;
              quantize_row(row.data(), kv_heads, d, type, tiny.data() + j * row_bytes);
              dequantize_row(tiny.data() + j * row_bytes, kv_heads, d, type,
                             tiny_exact.data() + j * row.size());
            }
            const std::vector<float> tiny_want =
                run(kernels::attend_keys, q_taken, k_exact.data(), tiny_exact.data(), kv_heads * d,
                    DType::kF32, 4);
            const std::vector<float> tiny_got =
                run(kernels::attend_keys_avx512, q, k.data(), tiny.data(), row_bytes, type, 1);
            for (std::size_t i = 0; i < tiny_want.size(); ++i) {
              ASSERT_NEAR(tiny_got[i], tiny_want[i],
                          1e-4 * std::fabs(tiny_want[i]) + 1e-39 * v_largest)
                  << "tiny values, " << i << " d " << d;
            }
          }
          if (type == DType::kFP8E4M3 && kvo::attend::avx512_vbmi_rows(type)) {
            // the dispatch took the byte tables (VBMI): the same bits as calling them
            ASSERT_EQ(
                run(kvo::attend::attend_keys_fp8_vbmi, q, k.data(), v.data(), row_bytes, type, 1),
                got)
                << "d " << d << " group " << group;
          }
          // A NaN in query row 1: that row NaN, the others unchanged.
          q[static_cast<std::size_t>(d) + 3] = NAN;
          const std::vector<float> with_nan =
              run(kernels::attend_keys_avx512, q, k.data(), v.data(), row_bytes, type, 1);
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (i / static_cast<std::size_t>(d) == 1) {
              ASSERT_TRUE(std::isnan(with_nan[i])) << i << " d " << d;
            } else {
              ASSERT_EQ(with_nan[i], got[i]) << i << " d " << d;
            }
          }
          if (type ==
              DType::kFP8E4M3) {  // NaN's code in key 7, kv head 1: its rows NaN, head 0's not
            q[static_cast<std::size_t>(d) + 3] = 0.5f;
            k[static_cast<std::size_t>(7 * row_bytes + d + 5)] = 0x7f;
            const std::vector<float> nan_key =
                run(kernels::attend_keys_avx512, q, k.data(), v.data(), row_bytes, type, 1);
            for (std::size_t i = 0; i < want.size(); ++i) {
              const bool head1 = i / static_cast<std::size_t>(d) >= static_cast<std::size_t>(group);
              ASSERT_EQ(std::isnan(nan_key[i]), head1) << i << " d " << d;
            }
          }
        }
}

// Every e4m3 code read by the AVX-512 kernel (through the byte tables where the CPU has VBMI, else
// through f16) as its exact value: one key, whose weight is exp(0) = 1 and whose value scales are
// 1, so the output is the value row itself. Its 256 codes fill the first kv heads' rows; head_dim
// 128 reads them 32 at a time, 96 the last 32 columns 16 at a time; 0x7f and 0xff give NaN.
TEST(HostAttention, DecodeKernelReadsEveryFp8Code) {
  if (!kernels::have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const auto& [kv_heads, d] : {std::pair{2, 128}, std::pair{3, 96}}) {
    const auto row_bytes = static_cast<std::int64_t>(quant_row_bytes(kv_heads, d));
    const auto scale_offset = static_cast<std::int64_t>(quant_scale_offset(kv_heads, d));
    std::vector<std::uint8_t> k(static_cast<std::size_t>(row_bytes), 0), v(k.size(), 0);
    for (int e = 0; e < kv_heads * d; ++e)
      v[static_cast<std::size_t>(e)] = static_cast<std::uint8_t>(e % 256);
    for (int g = 0; g < kv_heads; ++g) {
      const float one = 1.0f;
      std::memcpy(&k[static_cast<std::size_t>(scale_offset + 4 * g)], &one, 4);
      std::memcpy(&v[static_cast<std::size_t>(scale_offset + 4 * g)], &one, 4);
    }
    const int group = 1;
    std::vector<float> q(static_cast<std::size_t>(kv_heads) * d, 0.25f), acc(q.size(), 0.0f);
    std::vector<float> kv(kernels::kKeyBlock * kv_heads * d), scores(kv_heads * group * 16);
    std::vector<SoftmaxState> state(kv_heads);
    const kernels::KeyRows kr{k.data(), row_bytes, d, DType::kFP8E4M3, scale_offset};
    const kernels::KeyRows vr{v.data(), row_bytes, d, DType::kFP8E4M3, scale_offset};
    kernels::attend_keys_avx512(q.data(), kv_heads, group, d, kr, vr, 1, state.data(), acc.data(),
                                kv.data(), scores.data(), 0.0f);
    for (int e = 0; e < kv_heads * d; ++e) {
      const float want = quant::e4m3_to_float(static_cast<std::uint8_t>(e % 256));
      const float got = acc[static_cast<std::size_t>(e)] / state[e / d].sum;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << e % 256;
      } else {
        EXPECT_EQ(got, want) << "code " << e % 256 << " d " << d
                             << (kvo::attend::avx512_vbmi_rows(DType::kFP8E4M3) ? " (VBMI)" : "");
      }
    }
  }
}

// The portable kernel and the AVX-512 one (where the CPU has it) on the same keys, continuing a
// state across calls, with a group of 3 (the AVX-512 kernel pads it to 4) and a short last block;
// head_dim 64 takes bf16 rows as even and odd halves (the AVX-512 kernel's paired loads).
TEST(HostAttention, DecodeKernelsAgree) {
  std::mt19937 rng(6);
  const int kv_heads = 2, group = 3, keys = 45;
  for (const int d : {32, 64})
    for (const float cap : {0.0f, 2.0f})
      for (DType type : kTypes) {
        const Values k =
            random_values(static_cast<std::size_t>(keys) * kv_heads * d, type, 1.5f, rng);
        const Values v = random_values(k.exact.size(), type, 1.0f, rng);
        const std::vector<float> q =
            random_floats(static_cast<std::size_t>(kv_heads) * group * d, rng);
        const kernels::KeyRows kr{k.bytes.data(), kv_heads * d, d, type};
        const kernels::KeyRows vr{v.bytes.data(), kv_heads * d, d, type};
        std::vector<float> kv(kernels::kKeyBlock * kv_heads * d), scores(kv_heads * group * 16);
        auto run = [&](auto kernel) {
          std::vector<SoftmaxState> state(kv_heads * group);
          std::vector<float> acc(q.size(), 0.0f);
          kernel(q.data(), kv_heads, group, d, kr, vr, 20, state.data(), acc.data(), kv.data(),
                 scores.data(), cap);
          const std::size_t rest = static_cast<std::size_t>(20) * kv_heads * d;
          const kernels::KeyRows k2{k.bytes.data() + rest * elem_size(type), kv_heads * d, d, type};
          const kernels::KeyRows v2{v.bytes.data() + rest * elem_size(type), kv_heads * d, d, type};
          kernel(q.data(), kv_heads, group, d, k2, v2, keys - 20, state.data(), acc.data(),
                 kv.data(), scores.data(), cap);
          for (std::size_t row = 0; row < state.size(); ++row) {
            for (int e = 0; e < d; ++e) acc[row * d + e] /= state[row].sum;
          }
          return acc;
        };
        // float64: softmax(q k^T) v per row, with its float32 bound (the keys' scale is 1 here).
        Attended want;
        for (int row = 0; row < kv_heads * group; ++row) {
          const int g = row / group;
          std::vector<double> dots(keys), errors(keys), value_errors(keys, 0);
          std::vector<const float*> values(keys);
          for (int j = 0; j < keys; ++j) {
            double magnitude = 0;
            for (int e = 0; e < d; ++e) {
              const double term =
                  static_cast<double>(q[row * d + e]) * k.exact[(j * kv_heads + g) * d + e];
              dots[j] += term;
              magnitude += std::fabs(term);
            }
            errors[j] = gamma(d) * magnitude;
            if (cap > 0) {  // tanh's slope is at most 1; its own rounding a few ulp of the cap
              dots[j] = cap * std::tanh(dots[j] / cap);
              errors[j] += 4 * kU * cap;
            }
            values[j] = v.exact.data() + (j * kv_heads + g) * d;
          }
          const Attended a = softmax_weighted(dots, errors, 1.0, values, value_errors, d);
          want.value.insert(want.value.end(), a.value.begin(), a.value.end());
          want.bound.insert(want.bound.end(), a.bound.begin(), a.bound.end());
        }
        expect_near(run(kernels::attend_keys).data(), want, "portable");
        if (kernels::have_avx512())
          expect_near(run(kernels::attend_keys_avx512).data(), want, "avx512");
      }
}

TEST(HostAttention, SplitsKeysByCountAlone) {
  EXPECT_EQ(HostAttention::split(1).parts, 1);
  EXPECT_EQ(HostAttention::split(HostAttention::kMinPartKeys).parts, 1);
  EXPECT_EQ(HostAttention::split(HostAttention::kMinPartKeys + 1).parts, 2);
  for (int keys : {1, 100, 257, 4096, 32768, 131072, 1 << 20}) {
    const auto s = HostAttention::split(keys);
    EXPECT_LE(s.parts, HostAttention::kMaxParts) << keys;
    EXPECT_GE(s.parts * s.part_keys, keys) << keys;
    EXPECT_LT((s.parts - 1) * s.part_keys, keys) << keys;
  }
}

// The same inputs through pools of 1, 2 and 5 threads (more than this machine's cores), twice
// each: identical bits.
TEST(HostOps, SameBitsForAnyThreadCount) {
  std::mt19937 rng(5);
  const ModelConfig c = attention_config(4, 2, 32, 0);
  const int slots = 2, max_seq = 1500, n = 200, in = c.hidden_size, out = 300;
  for (DType type : kTypes) {
    Layer l = random_layer(c, type, slots, max_seq, rng);
    const Values w = random_values(static_cast<std::size_t>(out) * in, type, 0.5f, rng);
    const std::vector<float> x = random_floats(static_cast<std::size_t>(n) * in, rng);
    const std::vector<float> q = random_floats(static_cast<std::size_t>(n) * c.q_dim(), rng);
    const std::vector<std::int32_t> row_slots = {0, 1}, positions = {1499, 40};
    std::vector<float> first;
    for (int threads : {1, 2, 5, 2}) {
      HostOps ops(shape_of(c, type, n, slots, max_seq, threads));
      std::vector<float> y(static_cast<std::size_t>(n) * out);
      std::vector<float> prefill(q.size()), decode(2 * static_cast<std::size_t>(c.q_dim()));
      ops.linear(x.data(), n, in, WeightRef{w.bytes.data(), element_type(type)}, nullptr, out,
                 y.data(), false);
      ops.attention_prefill(q.data(), n, 1, 1000, 0, l.view, prefill.data());
      DecodeRows rows;
      rows.host_slots = row_slots.data();
      rows.host_positions = positions.data();
      ops.attention_decode(q.data(), 2, rows, 0, l.view, decode.data());
      std::vector<float> all = y;
      all.insert(all.end(), prefill.begin(), prefill.end());
      all.insert(all.end(), decode.begin(), decode.end());
      if (first.empty()) {
        first = all;
      } else {
        ASSERT_EQ(std::memcmp(all.data(), first.data(), all.size() * sizeof(float)), 0)
            << "threads " << threads << " dtype " << static_cast<int>(type);
      }
    }
  }
}

// ---- the pool --------------------------------------------------------------------------------

TEST(ThreadPool, RunsEveryTaskOnceAndRethrows) {
  for (int threads : {1, 2, 7}) {
    ThreadPool pool(threads);
    for (int loop = 0; loop < 2000; ++loop) {
      const int count = loop % 37;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(count));
      pool.run(count, [&](int i, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads " << threads << " loop " << loop;
    }
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.run(50,
                          [&](int i, int) {
                            ran.fetch_add(1);
                            if (i == 17) throw std::runtime_error("task 17");
                          }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 50);
  }
  EXPECT_THROW(ThreadPool(0), std::invalid_argument);
  EXPECT_GE(available_cores(), 1);
}

}  // namespace
}  // namespace kvo::model
