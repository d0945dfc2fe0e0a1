// The LibTorch adapter: over random steps (prefills, decodes, resets, strided inputs, with and
// without cache_position), attention computed with the tensors update() returns equals attention
// over a plain concatenated cache, and over an emulation of HF's StaticLayer with its
// max_cache_len mask; bad input raises a clear kvo::Error and leaves the adapter usable.
#include <gtest/gtest.h>

#include "cuda_required.hpp"
#include "expect_error.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/quant.hpp"
#include "kvoffload/torch.hpp"

namespace kvo {
namespace {

using testing::expect_error;

constexpr int kHeads = 4;  // query heads; kv_heads 2: grouped-query attention

CacheConfig small_config(BackendKind backend, DType dtype) {
  CacheConfig c;
  c.layers = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.max_seq = 80;
  c.slots = 2;
  c.dtype = dtype;
  c.resident_layers = 1;
  c.ring_depth = 2;
  c.backend = backend;
  c.host.max_delay_us = 30;
  c.host.delay_seed = 7;
  return c;
}

// Attention of the n new queries q [batch, heads, n, d], at positions [past, past + n), over
// k, v [batch, kv_heads, L, d]: causal (key j is visible to query i when j <= past + i), so key
// rows past the valid length, when L covers them, are masked. Computed in f32.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     std::int64_t past) {
  const std::int64_t groups = q.size(1) / k.size(1);
  const at::Tensor kf = k.to(at::kFloat).repeat_interleave(groups, 1);
  const at::Tensor vf = v.to(at::kFloat).repeat_interleave(groups, 1);
  const std::int64_t n = q.size(2);
  const std::int64_t length = k.size(2);
  const at::TensorOptions index = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor visible =
      at::arange(length, index).unsqueeze(0) <= at::arange(n, index).unsqueeze(1) + past;
  at::Tensor scores = at::matmul(q.to(at::kFloat), kf.transpose(-2, -1)) /
                      std::sqrt(static_cast<double>(q.size(3)));
  scores = scores.masked_fill(visible.logical_not(), -INFINITY);
  return at::matmul(at::softmax(scores, -1), vf);
}

// How far two float32 evaluations of attention() over the same rows may lie apart, whatever
// their summation orders and however many exactly-masked keys one of them adds (`keys`, the most
// keys either sums over), from float32's unit roundoff u = 2^-24 and gamma_n = n u / (1 - n u):
//   a score q.k / sqrt(d) is off by at most ds = (gamma_d + u) max_j |q||k_j| / sqrt(d);
//   softmax's weights then by a relative 2 ds, and by (keys + 4) u of their own rounding;
//   the weighted sum of v by gamma_keys max|v| (the weights sum to 1).
// Both evaluations err, so twice the sum, times max|v| for the weights' share.
double attention_difference_bound(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  std::int64_t keys) {
  const double u = std::ldexp(1.0, -24);
  const auto gamma = [u](std::int64_t n) {
    return static_cast<double>(n) * u / (1 - static_cast<double>(n) * u);
  };
  const std::int64_t d = q.size(3);
  const std::int64_t groups = q.size(1) / k.size(1);
  const at::Tensor kf = k.to(at::kFloat).abs().repeat_interleave(groups, 1);
  const double qk = at::matmul(q.to(at::kFloat).abs(), kf.transpose(-2, -1)).max().item<double>();
  const double ds = (gamma(d) + u) * qk / std::sqrt(static_cast<double>(d));
  const double v_max = v.to(at::kFloat).abs().max().item<double>();
  return 2 * v_max * (2 * ds + static_cast<double>(keys + 4) * u + gamma(keys));
}

// HF transformers' StaticLayer (cache_utils.py, 5.x): whole max_cache_len buffers, rows written
// with index_copy_ at the running length, the whole buffers returned.
struct HfStaticLayer {
  at::Tensor keys;    // [batch, kv_heads, max_cache_len, head_dim]
  at::Tensor values;  // same
  std::int64_t length = 0;
  std::tuple<at::Tensor, at::Tensor> update(const at::Tensor& k, const at::Tensor& v) {
    const at::Tensor position = at::arange(length, length + k.size(2), keys.device());
    keys.index_copy_(2, position, k);
    values.index_copy_(2, position, v);
    length += k.size(2);
    return {keys, values};
  }
};

// What a quantized cache gives back for rows t [batch, heads, n, dim]: each (token, head) row
// through kvo::quantize_row and kvo::dequantize_row (the library's own arithmetic, on the host),
// in t's dtype.
at::Tensor through_quantized_rows(const at::Tensor& t, DType stored) {
  const at::Tensor rows = t.to(at::kCPU, at::kFloat).transpose(1, 2).contiguous();
  const int heads = static_cast<int>(t.size(1));
  const int dim = static_cast<int>(t.size(3));
  at::Tensor out = at::empty_like(rows);
  std::vector<std::uint8_t> row(quant_row_bytes(heads, dim) + 4);
  void* aligned = row.data() + (4 - reinterpret_cast<std::uintptr_t>(row.data()) % 4) % 4;
  const std::int64_t count = rows.size(0) * rows.size(1);
  for (std::int64_t r = 0; r < count; ++r) {
    quantize_row(rows.data_ptr<float>() + r * heads * dim, heads, dim, stored, aligned);
    dequantize_row(aligned, heads, dim, stored, out.data_ptr<float>() + r * heads * dim);
  }
  return out.transpose(1, 2).to(t.device(), t.scalar_type());
}

// The same random run, in lockstep, on the adapter, a concatenated cache and HF's static layers.
// states: the dtype of keys and values in and out (the stored one's unless K/V is quantized).
// static_shapes: the adapter returns max_seq rows, the valid ones first.
class Lockstep {
 public:
  Lockstep(const CacheConfig& config, at::Device device, std::uint64_t seed,
           at::ScalarType states = at::ScalarType::Undefined, bool static_shapes = false)
      : config_(config),
        device_(device),
        static_shapes_(static_shapes),
        cache_(config, states, static_shapes),
        rng_(seed) {
    generator_ = at::make_generator<at::CPUGeneratorImpl>(seed);
    dtype_ = states != at::ScalarType::Undefined ? states
             : config.dtype == DType::kF32       ? at::kFloat
             : config.dtype == DType::kF16       ? at::kHalf
                                                 : at::kBFloat16;
    v_head_dim_ = config.v_head_dim > 0 ? config.v_head_dim : config.head_dim;
    clear_references();
  }

  kvo::torch::OffloadedStaticCache& cache() { return cache_; }
  std::int64_t length() const { return length_; }
  int checks() const { return checks_; }

  // Random tensors [batch, heads, n, dim] (dim 0: head_dim), made on the CPU with a seeded
  // generator; every other one through a transpose, so that update() also sees inputs that are
  // not contiguous. Magnitudes vary by row, and now and then a row is all zeros.
  at::Tensor random(std::int64_t heads, std::int64_t n, std::int64_t dim = 0) {
    if (dim == 0) dim = config_.head_dim;
    const bool strided = (rng_() & 1) != 0;
    const std::vector<std::int64_t> shape =
        strided ? std::vector<std::int64_t>{config_.slots, n, heads, dim}
                : std::vector<std::int64_t>{config_.slots, heads, n, dim};
    at::Tensor t = at::randn(shape, generator_, at::TensorOptions().dtype(at::kFloat));
    t = t * at::exp(at::randn({shape[0], shape[1], shape[2], 1}, generator_));
    if (rng_() % 5 == 0) t.select(0, 0).select(0, 0).zero_();
    if (strided) t = t.transpose(1, 2);
    return t.to(device_, dtype_);
  }

  // What the cache gives back for rows t: t itself, or t through quantized rows.
  at::Tensor stored(const at::Tensor& t) const {
    return is_quantized(config_.dtype) ? through_quantized_rows(t, config_.dtype) : t;
  }

  // One step of n tokens through every layer; checks what every update returned.
  void step(std::int64_t n, bool with_positions, int peek_at_layer) {
    const std::int64_t past = length_;
    for (int layer = 0; layer < config_.layers; ++layer) {
      const at::Tensor k = random(config_.kv_heads, n);
      const at::Tensor v = random(config_.kv_heads, n, v_head_dim_);
      const at::Tensor q = random(kHeads, n);
      at::Tensor position;
      if (with_positions) {
        position = at::arange(past, past + n, at::TensorOptions().dtype(at::kLong));
      }
      auto [all_keys, all_values] = cache_.update(k, v, layer, position);

      // Shape and layout: the valid rows only (static shapes: max_seq rows), a strided view of
      // the cache's buffer.
      const std::int64_t rows = static_shapes_ ? config_.max_seq : past + n;
      ASSERT_EQ(all_keys.sizes(),
                (at::IntArrayRef{config_.slots, config_.kv_heads, rows, config_.head_dim}));
      ASSERT_EQ(all_values.sizes(),
                (at::IntArrayRef{config_.slots, config_.kv_heads, rows, v_head_dim_}));
      if (static_shapes_) {
        // Past the valid rows: finite values (zeros, or rows an earlier layer or step left),
        // which the causal mask hides; attention over all of them is checked below.
        EXPECT_TRUE(at::isfinite(all_keys.to(at::kFloat)).all().item<bool>()) << "layer " << layer;
        EXPECT_TRUE(at::isfinite(all_values.to(at::kFloat)).all().item<bool>())
            << "layer " << layer;
        EXPECT_EQ(all_keys.stride(2), all_values.stride(2) * config_.head_dim / v_head_dim_);
      }
      const at::Tensor keys = all_keys.narrow(2, 0, past + n);
      const at::Tensor values = all_values.narrow(2, 0, past + n);
      EXPECT_EQ(keys.device(), device_);
      EXPECT_EQ(keys.scalar_type(), dtype_);
      EXPECT_EQ(values.scalar_type(), dtype_);
      EXPECT_EQ(keys.stride(3), 1);
      EXPECT_EQ(keys.stride(2), config_.kv_heads * config_.head_dim);  // NHD underneath
      EXPECT_EQ(values.stride(2), config_.kv_heads * v_head_dim_);

      // Against the concatenated cache: the same rows, bit for bit (quantized: the library's
      // own quantize-dequantize of them), and the same attention.
      const auto l = static_cast<std::size_t>(layer);
      const at::Tensor k_stored = stored(k);
      const at::Tensor v_stored = stored(v);
      concat_k_[l] = at::cat({concat_k_[l], k_stored}, 2);
      concat_v_[l] = at::cat({concat_v_[l], v_stored}, 2);
      EXPECT_TRUE(at::equal(keys, concat_k_[l])) << "layer " << layer << " at " << past;
      EXPECT_TRUE(at::equal(values, concat_v_[l])) << "layer " << layer << " at " << past;
      const at::Tensor ours = attention(q, keys, values, past);
      const at::Tensor plain = attention(q, concat_k_[l], concat_v_[l], past);
      const double bound = attention_difference_bound(q, keys, values, past + n);
      EXPECT_LE((ours - plain).abs().max().item<double>(), bound) << "layer " << layer;
      if (static_shapes_) {
        const at::Tensor over_all = attention(q, all_keys, all_values, past);
        const double all_bound = attention_difference_bound(q, all_keys, all_values, rows);
        EXPECT_LE((over_all - plain).abs().max().item<double>(), all_bound) << "layer " << layer;
      }

      // Against HF's StaticLayer: attention over its whole buffers with a max_cache_len mask
      // sees exactly the rows the adapter returns.
      auto [hf_keys, hf_values] = hf_[l].update(k_stored, v_stored);
      EXPECT_TRUE(at::equal(keys, hf_keys.narrow(2, 0, past + n)));
      const at::Tensor hf = attention(q, hf_keys, hf_values, past);
      // HF's sums run over all max_cache_len keys, the masked ones adding exact zeros.
      const double hf_bound = attention_difference_bound(q, hf_keys, hf_values, hf_keys.size(2));
      EXPECT_LE((ours - hf).abs().max().item<double>(), hf_bound) << "layer " << layer;
      ++checks_;

      if (layer == peek_at_layer) {
        // As HF counts it: layer 0 already holds this step's rows. The step stays open until
        // its last layer was updated.
        EXPECT_EQ(cache_.get_seq_length(), past + n);
        EXPECT_EQ(cache_.cache().in_step(), layer + 1 < config_.layers);
      }
    }
    length_ += n;
  }

  void reset() {
    cache_.reset();
    clear_references();
  }

  // Random steps: a prefill now and then, mostly decodes, a reset when the cache is nearly full.
  void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      std::int64_t n = (rng_() % 5 == 0) ? 2 + static_cast<std::int64_t>(rng_() % 11) : 1;
      if (length_ + n > config_.max_seq || rng_() % 25 == 0) reset();
      const int peek = static_cast<int>(rng_() % static_cast<std::uint64_t>(config_.layers * 3));
      step(n, rng_() % 3 == 0, peek);
      if (rng_() % 4 == 0) {
        EXPECT_EQ(cache_.get_seq_length(), length_);
        EXPECT_FALSE(cache_.cache().in_step());  // every layer was updated: the step ended
      }
    }
  }

 private:
  void clear_references() {
    length_ = 0;
    const at::TensorOptions options = at::TensorOptions().dtype(dtype_).device(device_);
    concat_k_.assign(static_cast<std::size_t>(config_.layers),
                     at::empty({config_.slots, config_.kv_heads, 0, config_.head_dim}, options));
    concat_v_.assign(static_cast<std::size_t>(config_.layers),
                     at::empty({config_.slots, config_.kv_heads, 0, v_head_dim_}, options));
    hf_.clear();
    for (int layer = 0; layer < config_.layers; ++layer) {
      hf_.push_back(
          {at::zeros({config_.slots, config_.kv_heads, config_.max_seq, config_.head_dim}, options),
           at::zeros({config_.slots, config_.kv_heads, config_.max_seq, v_head_dim_}, options), 0});
    }
  }

  CacheConfig config_;
  at::Device device_;
  bool static_shapes_;
  at::ScalarType dtype_;
  std::int64_t v_head_dim_ = 0;
  kvo::torch::OffloadedStaticCache cache_;
  std::mt19937_64 rng_;
  at::Generator generator_;
  std::vector<at::Tensor> concat_k_, concat_v_;  // [layer] -> [batch, kv_heads, length, d]
  std::vector<HfStaticLayer> hf_;
  std::int64_t length_ = 0;
  int checks_ = 0;
};

class TorchCacheCpu : public ::testing::TestWithParam<DType> {};

TEST_P(TorchCacheCpu, AttentionMatchesAConcatenatedCacheOverRandomSteps) {
  for (std::uint64_t seed : {1u, 2u}) {
    Lockstep run(small_config(BackendKind::kHost, GetParam()), at::Device(at::kCPU), seed);
    run.run(60);
    EXPECT_GT(run.checks(), 200);
    const CacheStats stats = run.cache().cache().stats();
    EXPECT_GT(stats.h2d_bytes_total, 0u);  // layers really were streamed
    EXPECT_GT(stats.d2h_bytes_total, 0u);
  }
}

// Static shapes: max_seq rows every update, for the stored dtypes and the quantized ones; rows
// past the valid ones are finite and masked, so attention over all of them is attention over
// the valid rows. Streamed layers' staging buffers hold other layers' rows there, resident
// layers zeros or earlier steps' rows.
TEST(TorchCacheStaticShapes, EveryUpdateReturnsMaxSeqRowsTheValidOnesFirst) {
  for (DType stored : {DType::kF32, DType::kBF16, DType::kInt8, DType::kFP8E4M3}) {
    SCOPED_TRACE(dtype_name(stored));
    Lockstep run(small_config(BackendKind::kHost, stored), at::Device(at::kCPU), 11,
                 is_quantized(stored) ? at::kFloat : at::ScalarType::Undefined,
                 /*static_shapes=*/true);
    run.run(30);
    EXPECT_GT(run.checks(), 90);
    EXPECT_TRUE(run.cache().static_shapes());
    // Only the valid rows moved: the same bytes as without static shapes.
    Lockstep plain(small_config(BackendKind::kHost, stored), at::Device(at::kCPU), 11,
                   is_quantized(stored) ? at::kFloat : at::ScalarType::Undefined);
    plain.run(30);
    EXPECT_EQ(run.cache().cache().stats().h2d_bytes_total,
              plain.cache().cache().stats().h2d_bytes_total);
  }
}

// A cache never written reads as zeros, not as whatever the allocator left (here NaN bytes of a
// freed block of the arena's size; under ASan, its malloc fill byte).
TEST(TorchCacheStaticShapes, AFreshCacheReadsZerosPastTheFirstRows) {
  CacheConfig config = small_config(BackendKind::kHost, DType::kF32);
  config.resident_layers = 2;
  {
    const std::size_t arena = 4 * 2 * 2 * 80 * 2 * 16 * sizeof(float);  // 4 layer buffers
    void* dirty = std::aligned_alloc(256, arena);
    ASSERT_NE(dirty, nullptr);
    std::memset(dirty, 0xff, arena);  // NaN floats
    std::free(dirty);
  }
  kvo::torch::OffloadedStaticCache cache(config, at::ScalarType::Undefined, true);
  const at::Tensor k = at::ones({2, 2, 3, 16});
  for (int layer = 0; layer < config.layers; ++layer) {
    auto [keys, values] = cache.update(k, k, layer);
    EXPECT_TRUE(at::equal(keys.narrow(2, 0, 3), k)) << layer;
    EXPECT_EQ(keys.narrow(2, 3, config.max_seq - 3).abs().sum().item<float>(), 0.0f) << layer;
    EXPECT_EQ(values.narrow(2, 3, config.max_seq - 3).abs().sum().item<float>(), 0.0f) << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, TorchCacheCpu,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

// Quantized K/V: the adapter quantizes the rows it is given with torch operations (on the
// tensors' device) and must land on the library's own bits, or the keys it returns would differ
// from kvo::dequantize_row(kvo::quantize_row(k)) here.
TEST(TorchCacheQuantized, RowsAreTheLibrarysQuantizedRowsInTheCallersDtype) {
  for (DType stored : {DType::kFP8E4M3, DType::kInt8}) {
    for (at::ScalarType states : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(stored)) + " from " + c10::toString(states));
      Lockstep run(small_config(BackendKind::kHost, stored), at::Device(at::kCPU), 5, states);
      run.run(20);
      EXPECT_GT(run.checks(), 60);
      const CacheStats stats = run.cache().cache().stats();
      EXPECT_GT(stats.h2d_bytes_total, 0u);
      EXPECT_EQ(stats.plan.row_bytes, quant_row_bytes(2, 16));  // 32 bytes and 2 scales
    }
  }
}

TEST(TorchCacheQuantized, NeedsTheDtypeTheModelComputesIn) {
  expect_error(
      [] { kvo::torch::OffloadedStaticCache(small_config(BackendKind::kHost, DType::kInt8)); },
      ErrorCode::kInvalidArgument,
      "a cache of int8 K/V quantizes keys and values computed in float, half or "
      "bfloat16 and returns them in that dtype: give it as states_dtype (got none)");
  expect_error(
      [] {
        kvo::torch::OffloadedStaticCache(small_config(BackendKind::kHost, DType::kFP8E4M3),
                                         at::kDouble);
      },
      ErrorCode::kInvalidArgument, "(got Double)");
  expect_error(
      [] {
        kvo::torch::OffloadedStaticCache(small_config(BackendKind::kHost, DType::kBF16),
                                         at::kFloat);
      },
      ErrorCode::kInvalidArgument, "states_dtype must be BFloat16 (or left undefined), not Float");
}

// Multi-head latent attention caches keys and values of different head sizes.
TEST(TorchCacheCpu, KeysAndValuesOfDifferentHeadSizes) {
  for (DType stored : {DType::kBF16, DType::kInt8}) {
    CacheConfig config = small_config(BackendKind::kHost, stored);
    config.v_head_dim = 8;
    Lockstep run(config, at::Device(at::kCPU), 9, at::kBFloat16);
    run.run(30);
    EXPECT_GT(run.checks(), 100);
  }
  CacheConfig config = small_config(BackendKind::kHost, DType::kF32);
  config.v_head_dim = 8;
  kvo::torch::OffloadedStaticCache cache(config);
  const at::Tensor k = at::zeros({1, 2, 1, 16});
  expect_error([&] { cache.update(k, k, 0); }, ErrorCode::kInvalidArgument,
               "value_states has shape [1, 2, 1, 16], expected [1..2 (batch <= slots), 2 "
               "(kv_heads), n >= 1 (tokens), 8 (head_dim)]");
  expect_error(
      [&] {
        cache.update(k, at::zeros({1, 2, 2, 8}), 0);
      },
      ErrorCode::kInvalidArgument, "differ in batch or tokens");
}

TEST(TorchCacheCuda, AttentionMatchesAConcatenatedCacheOverRandomSteps) {
  KVO_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    CacheConfig config = small_config(BackendKind::kCuda, dtype);
    Lockstep run(config, at::Device(at::kCUDA, 0), 3);
    run.run(60);
    EXPECT_GT(run.checks(), 200);
    EXPECT_GT(run.cache().cache().stats().h2d_bytes_total, 0u);
  }
  // Quantized on the device by the same torch operations: the library's bits there too.
  for (DType stored : {DType::kFP8E4M3, DType::kInt8}) {
    Lockstep run(small_config(BackendKind::kCuda, stored), at::Device(at::kCUDA, 0), 4,
                 at::kBFloat16);
    run.run(30);
    EXPECT_GT(run.checks(), 100);
  }
  // Static shapes: max_seq rows from cudaMalloc'd buffers, finite past the valid rows.
  for (DType stored : {DType::kBF16, DType::kInt8}) {
    Lockstep run(small_config(BackendKind::kCuda, stored), at::Device(at::kCUDA, 0), 6,
                 at::kBFloat16, /*static_shapes=*/true);
    run.run(30);
    EXPECT_GT(run.checks(), 100);
  }
}

// A caller that switches torch's current stream between its last update and the commit. Layers
// before the last are updated on stream C; the last on stream A, whose attention (here a copy of
// the returned keys and values) waits behind a long queue of matrix products there. Then B
// becomes current and end_step() commits. The release must be recorded on A, where that layer
// was appended and attended: recorded on the idle B, it would let the ring refill the buffer at
// once with the next step's layer 1 while A's attention has yet to read it, and A's copies would
// show layer 1's rows. On the host backend this cannot arise: CPU tensors have no streams, and the
// adapter always runs the host backend synchronously (stream nullptr).
TEST(TorchCacheCuda, SwitchingStreamsBeforeTheCommitKeepsEveryRow) {
  KVO_SKIP_WITHOUT_CUDA();
  CacheConfig config = small_config(BackendKind::kCuda, DType::kF32);
  config.slots = 1;
  config.resident_layers = 0;  // every layer through the staging ring
  config.ring_depth = 2;
  kvo::torch::OffloadedStaticCache cache(config);
  const at::Device device(at::kCUDA, 0);
  const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  const c10::Stream a = cuda.getStreamFromGlobalPool(device);
  const c10::Stream b = cuda.getStreamFromGlobalPool(device);
  const c10::Stream c = cuda.getStreamFromGlobalPool(device);
  const c10::Stream original = cuda.exchangeStream(c);
  const at::TensorOptions on_gpu = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor x = at::randn({2048, 2048}, on_gpu);
  const int last = config.layers - 1;
  std::vector<at::Tensor> expected_k(static_cast<std::size_t>(config.layers));
  std::vector<at::Tensor> expected_v(expected_k.size());
  for (int step = 0; step < 6; ++step) {
    const std::int64_t n = step == 0 ? 5 : 1;
    at::Tensor seen_k, seen_v;  // what the last layer's attention read, on A
    for (int layer = 0; layer < config.layers; ++layer) {
      const auto l = static_cast<std::size_t>(layer);
      cuda.exchangeStream(layer == last ? a : c);
      const at::Tensor k = at::randn({1, config.kv_heads, n, config.head_dim}, on_gpu);
      const at::Tensor v = at::randn({1, config.kv_heads, n, config.head_dim}, on_gpu);
      auto [keys, values] = cache.update(k, v, layer);
      expected_k[l] = step == 0 ? k : at::cat({expected_k[l], k}, 2);
      expected_v[l] = step == 0 ? v : at::cat({expected_v[l], v}, 2);
      if (layer == last) {
        at::Tensor busy = x;
        for (int i = 0; i < 40; ++i) busy = at::mm(busy, x).div_(2048.0f);  // keeps A busy
        seen_k = keys.clone();  // the attention, behind the queue on A
        seen_v = values.clone();
      } else {
        EXPECT_TRUE(at::equal(keys, expected_k[l])) << "step " << step << " layer " << layer;
        EXPECT_TRUE(at::equal(values, expected_v[l])) << "step " << step << " layer " << layer;
      }
    }
    cuda.exchangeStream(b);
    cache.end_step();  // commits on B; the last layer was appended and attended on A
    cuda.exchangeStream(a);
    EXPECT_TRUE(at::equal(seen_k, expected_k[static_cast<std::size_t>(last)])) << "step " << step;
    EXPECT_TRUE(at::equal(seen_v, expected_v[static_cast<std::size_t>(last)])) << "step " << step;
  }
  cuda.synchronizeStream(a);
  cuda.synchronizeStream(b);
  cuda.synchronizeStream(c);
  cuda.exchangeStream(original);
  EXPECT_EQ(cache.get_seq_length(), 10);
  EXPECT_GT(cache.cache().stats().h2d_bytes_total, 0u);
}

TEST(TorchCacheErrors, BadInputIsNamedAndChangesNothing) {
  const CacheConfig config = small_config(BackendKind::kHost, DType::kF32);
  Lockstep run(config, at::Device(at::kCPU), 11);
  auto& cache = run.cache();
  run.step(5, false, -1);
  run.step(1, true, -1);
  const at::Tensor good = run.random(config.kv_heads, 1);
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);

  expect_error([&] { cache.update(good.to(at::kDouble), good, 0); }, ErrorCode::kInvalidArgument,
               "key_states has dtype Double, the cache stores Float");
  expect_error([&] { cache.update(good, good.to(at::kHalf), 0); }, ErrorCode::kInvalidArgument,
               "value_states has dtype Half");
  expect_error([&] { cache.update(good.to(at::kMeta), good, 0); }, ErrorCode::kInvalidArgument,
               "key_states is on meta, the cache is on cpu");
  expect_error([&] { cache.update(good[0], good, 0); }, ErrorCode::kInvalidArgument,
               "has shape [2, 1, 16], expected [1..2 (batch <= slots), 2 (kv_heads)");
  expect_error(
      [&] {
        cache.update(at::zeros({3, 2, 1, 16}, f32), good, 0);
      },
      ErrorCode::kInvalidArgument, "[3, 2, 1, 16]");
  expect_error(
      [&] {
        cache.update(at::zeros({2, 4, 1, 16}, f32), good, 0);
      },
      ErrorCode::kInvalidArgument, "(kv_heads)");
  expect_error(
      [&] {
        cache.update(at::zeros({2, 2, 1, 8}, f32), good, 0);
      },
      ErrorCode::kInvalidArgument, "(head_dim)");
  expect_error(
      [&] {
        cache.update(at::zeros({2, 2, 0, 16}, f32), good, 0);
      },
      ErrorCode::kInvalidArgument, "n >= 1");
  expect_error(
      [&] {
        cache.update(good, at::zeros({2, 2, 2, 16}, f32), 0);
      },
      ErrorCode::kInvalidArgument, "differ in batch or tokens");
  expect_error([&] { cache.update(good, good, 4); }, ErrorCode::kInvalidArgument,
               "layer_idx 4 is out of range (the cache has 4 layers)");
  expect_error([&] { cache.update(good, good, -1); }, ErrorCode::kInvalidArgument, "layer_idx -1");
  expect_error([&] { cache.update(good, good, 2); }, ErrorCode::kProtocol,
               "every layer of the step was updated; layer 0 starts the next");
  EXPECT_EQ(cache.get_seq_length(), 6);  // ends the step
  expect_error([&] { cache.update(good, good, 2); }, ErrorCode::kProtocol, "before layer 0");
  expect_error([&] { cache.update(good, good, 0, at::arange(7, 8, at::kLong)); },
               ErrorCode::kInvalidArgument, "holds 6 tokens, so the 1 new ones go at [6, 7)");
  expect_error([&] { cache.update(good, good, 0, at::arange(6, 8, at::kLong)); },
               ErrorCode::kInvalidArgument, "1-D integer tensor of the 1 new positions");
  expect_error([&] { cache.update(good, good, 0, at::arange(6, 7, f32)); },
               ErrorCode::kInvalidArgument, "integer tensor");
  expect_error(
      [&] {
        cache.update(at::zeros({2, 2, 75, 16}, f32), at::zeros({2, 2, 75, 16}, f32), 0);
      },
      ErrorCode::kInvalidArgument, "would pass max_cache_len (80)");
  EXPECT_EQ(cache.get_seq_length(), 6);
  EXPECT_FALSE(cache.cache().in_step());

  // Inside a step: order, token counts, ending early.
  run.step(1, false, -1);  // a full, correct step (its last layer stays held)
  EXPECT_EQ(run.length(), 7);
  cache.update(good, good, 0);  // a new step, made by hand: then errors
  expect_error([&] { cache.update(good, good, 2); }, ErrorCode::kProtocol,
               "out of order: expected layer 1");
  expect_error([&] { cache.update(good, good, 0); }, ErrorCode::kProtocol,
               "updated only layers [0, 1) of 4");
  expect_error(
      [&] {
        cache.update(at::zeros({2, 2, 2, 16}, f32), at::zeros({2, 2, 2, 16}, f32), 1);
      },
      ErrorCode::kInvalidArgument, "with 2 tokens, but layer 0 of this step had 1");
  expect_error([&] { cache.end_step(); }, ErrorCode::kProtocol, "updating only layers [0, 1)");
  EXPECT_EQ(cache.get_seq_length(), 8);  // layer 0 holds the open step's token
  cache.reset();                         // drops the open step and every row
  EXPECT_EQ(cache.get_seq_length(), 0);
  EXPECT_FALSE(cache.cache().in_step());

  // Still usable, and checked against the references again from empty.
  run.reset();
  run.step(9, true, 2);
  run.run(10);
  EXPECT_EQ(cache.get_seq_length(), run.length());
  EXPECT_EQ(cache.get_max_cache_shape(), 80);
}

TEST(TorchCacheErrors, CudaTensorsOnTheHostBackendAreRefused) {
  KVO_SKIP_WITHOUT_CUDA();
  kvo::torch::OffloadedStaticCache cache(small_config(BackendKind::kHost, DType::kF32));
  const at::Tensor cuda = at::zeros({2, 2, 1, 16}, at::TensorOptions().device(at::kCUDA));
  expect_error([&] { cache.update(cuda, cuda, 0); }, ErrorCode::kInvalidArgument,
               "key_states is on cuda:0, the cache is on cpu");
}

}  // namespace
}  // namespace kvo
