// Matrices in GGUF blocks on the CUDA path (model/cuda/kernels_blocks.cu), against the host path,
// whose block arithmetic is checked bit for bit against the gguf package (GgufReference) and
// whose exact decode rows are dot products of the expanded weights (host_ops_test):
// - a decode step's rows (1, 3, 8) through the kernel that reads the blocks
//   once (up to kBlockDecodeRows): f32 products summed in another order than the host's, so 2
//   gamma_in sum |w x| bounds the difference;
// - a prefill chunk (40 rows) through tiles of rows dequantized into bf16 and multiplied by cuBLAS
//   (the input rounded to bf16 too): the host's exact result within 2 u_bf16 sum |w x| plus the
//   sums' rounding; out (700) spans two tiles of the planned 512 rows;
// - bias and accumulate, as the model-dtype path has them;
// - the embedding's rows, bit for bit the host's dequantization (the header's arithmetic, its
//   products rounded on their own on both sides).
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_required.hpp"
#include "kvoffload/cache.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_kernels.hpp"
#include "model/host/host_linear.hpp"
#include "model_test_util.hpp"
#include "rounding.hpp"

namespace kvo::model {
namespace {

using testing::gamma;
using testing::kU;

TEST(CudaBlocks, DecodeRowsTilesAndEmbeddingsAsTheHostPath) {
  KVO_SKIP_WITHOUT_CUDA();
  ModelConfig c = preset("tiny");
  c.hidden_size = 512;
  c.intermediate_size = 512;
  c.heads = 8;
  c.head_dim = 64;
  c.kv_heads = 8;
  c.vocab_size = 300;
  const int in = 512, out = 700, max_rows = 40;
  OpsShape shape;
  shape.config = c;
  shape.weight_dtype = DType::kBF16;
  shape.kv_dtype = DType::kBF16;
  shape.max_rows = max_rows;
  shape.max_decode_rows = 1;
  shape.max_seq = 64;
  shape.threads = 2;
  shape.weight_blocks = true;
  shape.kernels = choose_attention_kernels(c, DType::kBF16, 1, 64, max_rows, true);
  const WorkspaceLayout layout(c, DType::kBF16, DType::kBF16, max_rows, 1, 64, shape.kernels, true);
  ASSERT_EQ(layout.block_tile_rows, 512);  // out spans two tiles
  const std::uint64_t f = sizeof(float);
  CacheConfig cc;
  cc.layers = 1;
  cc.kv_heads = c.kv_heads;
  cc.head_dim = c.head_dim;
  cc.max_seq = 64;
  cc.slots = 1;
  cc.dtype = DType::kBF16;
  cc.backend = BackendKind::kCuda;
  const std::uint64_t max_w = static_cast<std::uint64_t>(out) * in;  // bytes >= any type's
  cc.reserved = {{"workspace", layout.bytes},
                 {"w", max_w},
                 {"x", static_cast<std::uint64_t>(max_rows) * in * f},
                 {"y", static_cast<std::uint64_t>(max_rows) * out * f},
                 {"bias", static_cast<std::uint64_t>(out) * 2},
                 {"tokens", 64 * sizeof(std::int32_t)}};
  OffloadedStaticCache cache(cc);
  void* stream = cache.create_stream();
  {
    std::unique_ptr<Ops> ops = make_cuda_ops(shape, stream, cache.reserved("workspace"));
    ThreadPool pool(2);
    HostLinear host(pool, DType::kF32, in, false, true);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (const std::uint32_t type : {blocks::kQ8_0, blocks::kQ4_0, blocks::kQ4_1, blocks::kQ4_K,
                                     blocks::kQ5_K, blocks::kQ6_K}) {
      SCOPED_TRACE(ggml_type(type)->name);
      const std::vector<std::uint8_t> w = testing::random_block_matrix(type, out, in, rng);
      std::vector<float> wf(static_cast<std::size_t>(out) * in);
      kernels::dequantize_rows(type, w.data(), out, in, wf.data());
      std::vector<std::uint16_t> bias(out);
      std::vector<float> bias_f(out);
      for (int o = 0; o < out; ++o) {
        bias[static_cast<std::size_t>(o)] = float_to_bf16(normal(rng));
        bias_f[static_cast<std::size_t>(o)] = bf16_to_float(bias[static_cast<std::size_t>(o)]);
      }
      cache.copy_to_device(cache.reserved("w"), w.data(), w.size());
      cache.copy_to_device(cache.reserved("bias"), bias.data(), bias.size() * 2);
      for (const int n : {1, 3, kBlockDecodeRows, max_rows}) {
        std::vector<float> x(static_cast<std::size_t>(n) * in);
        for (auto& v : x) v = normal(rng);
        std::vector<float> y(static_cast<std::size_t>(n) * out, 0.25f), expected(y);
        cache.copy_to_device(cache.reserved("x"), x.data(), x.size() * f);
        cache.copy_to_device(cache.reserved("y"), y.data(), y.size() * f);
        ops->linear(static_cast<float*>(cache.reserved("x")), n, in,
                    WeightRef{cache.reserved("w"), type_of_ggml(type)}, cache.reserved("bias"), out,
                    static_cast<float*>(cache.reserved("y")), true);
        ops->synchronize();
        cache.copy_to_host(y.data(), cache.reserved("y"), y.size() * f);
        host(x.data(), n, in, WeightRef{w.data(), type_of_ggml(type)}, nullptr, out,
             expected.data(), true);
        const bool tiled = n > kBlockDecodeRows;
        for (int t = 0; t < n; ++t) {
          for (int o = 0; o < out; ++o) {
            double magnitude = 0;
            for (int i = 0; i < in; ++i) {
              magnitude += std::fabs(static_cast<double>(wf[static_cast<std::size_t>(o) * in + i]) *
                                     x[static_cast<std::size_t>(t) * in + i]);
            }
            const std::size_t at = static_cast<std::size_t>(t) * out + o;
            const double bound = (tiled ? 2.0 / 256 + 3 * gamma(in) : 2 * gamma(in)) * magnitude +
                                 4 * kU * (4 + std::fabs(expected[at]));
            ASSERT_NEAR(y[at], expected[at] + bias_f[static_cast<std::size_t>(o)], bound)
                << n << " rows, row " << t << ", output " << o;
          }
        }
      }
      // The embedding: rows of a [out][in] table, tokens drawn with repeats.
      std::vector<std::int32_t> tokens(16);
      for (auto& token : tokens) token = static_cast<std::int32_t>(rng() % out);
      cache.copy_to_device(cache.reserved("tokens"), tokens.data(), tokens.size() * 4);
      ops->embed(static_cast<std::int32_t*>(cache.reserved("tokens")), 16,
                 WeightRef{cache.reserved("w"), type_of_ggml(type)},
                 static_cast<float*>(cache.reserved("y")));
      ops->synchronize();
      std::vector<float> rows(16 * static_cast<std::size_t>(in));
      cache.copy_to_host(rows.data(), cache.reserved("y"), rows.size() * f);
      for (int r = 0; r < 16; ++r) {
        ASSERT_EQ(
            std::memcmp(&rows[static_cast<std::size_t>(r) * in],
                        &wf[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)]) * in],
                        static_cast<std::size_t>(in) * f),
            0)
            << "token " << tokens[static_cast<std::size_t>(r)];
      }
    }
  }
  cache.destroy_stream(stream);
}

}  // namespace
}  // namespace kvo::model
