// Quantized K/V on the CUDA path, against the host path (whose quantizer and attention are
// checked against float64 references in tests/offload/quant_test.cpp and host_ops_test.cpp):
// - the quantize kernel writes the bytes quantize_row writes on the host, bit for bit;
// - the built-in kernels attend over quantized rows (fp8, int8) as the host path does over the
//   same bytes: prefill after a prefix, and decode of two slots of different lengths, one long
//   enough to split its keys. Both compute in f32, so 1e-4 * max|v| bounds the difference.
// - FlashInfer over bf16 tiles (attention_kernels.hpp: head_dim 64, 128, 256) attends as a float64
//   reference over the same rows dequantized and rounded to bf16, and over the queries rounded to
//   bf16: its scores are then exact products summed in f32, and what remains is FlashInfer's
//   rounding of the softmax weights to bf16 before P.V (2u max|v|, u = 2^-8), of each tile's
//   output (u max|v|) and of split-KV partials (u max|v|), merged in f32 as convex combinations:
//   6u max|v| bounds it. Contexts span several tiles, with and without a sliding window; the
//   rows' wide-ranging heads make the scores sharp, so a misplaced mask or tile moves outputs by
//   a large part of max|v|.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_required.hpp"
#include "kvoffload/cache.hpp"
#include "kvoffload/quant.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_ops.hpp"

namespace kvo::model {
namespace {

struct QuantShape {
  DType dtype = DType::kFP8E4M3;
  int heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int slots = 2;
  int max_seq = 3072;
  int max_rows = 512;
  int sliding_window = 0;
  bool builtin = true;  // the built-in kernels; false: FlashInfer over bf16 tiles
};

class QuantRig {
 public:
  explicit QuantRig(const QuantShape& s) : s_(s), rng_(static_cast<unsigned>(s.head_dim)) {
    config_ = preset("tiny");
    config_.heads = s.heads;
    config_.kv_heads = s.kv_heads;
    config_.head_dim = s.head_dim;
    config_.sliding_window = s.sliding_window;
    row_bytes_ = quant_row_bytes(s.kv_heads, s.head_dim);
    OpsShape shape;
    shape.config = config_;
    shape.weight_dtype = DType::kBF16;
    shape.kv_dtype = s.dtype;
    shape.max_rows = s.max_rows;
    shape.max_decode_rows = s.slots;
    shape.max_seq = s.max_seq;
    shape.threads = 2;
    shape.kernels =
        choose_attention_kernels(config_, s.dtype, s.slots, s.max_seq, s.max_rows, s.builtin);
    const WorkspaceLayout layout(config_, DType::kBF16, s.dtype, s.max_rows, s.slots, s.max_seq,
                                 shape.kernels);
    kernels_ = layout.kernels;
    const std::uint64_t f = sizeof(float);
    const std::uint64_t rows = static_cast<std::uint64_t>(s.max_rows);
    CacheConfig c;
    c.layers = 1;
    c.kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.max_seq = s.max_seq;
    c.slots = s.slots;
    c.dtype = s.dtype;
    c.backend = BackendKind::kCuda;
    c.reserved = {{"workspace", layout.bytes},
                  {"x", 2 * rows * config_.kv_dim() * f},
                  {"rows", 2 * rows * row_bytes_},
                  {"q", rows * config_.q_dim() * f},
                  {"out", rows * config_.q_dim() * f},
                  {"decode_rows", 2 * static_cast<std::uint64_t>(s.slots) * sizeof(std::int32_t)}};
    cache_ = std::make_unique<OffloadedStaticCache>(c);
    stream_ = cache_->create_stream();
    ops_ = make_cuda_ops(shape, stream_, cache_->reserved("workspace"));
    host_ops_ = std::make_unique<HostOps>(shape);
    const std::size_t layer = static_cast<std::size_t>(s.slots) * s.max_seq * row_bytes_;
    host_k_.assign(layer, 0);
    host_v_.assign(layer, 0);
  }
  ~QuantRig() {
    cache_->synchronize_stream(stream_);
    ops_.reset();
    cache_->destroy_stream(stream_);
  }

  const AttentionKernels& kernels() const { return kernels_; }
  int mismatched_bytes() const { return mismatched_bytes_; }

  // n new rows of `slot` at `position` (drawn f32, heads of different ranges, an outlier),
  // quantized on the device by to_cache_rows and appended; the device's bytes are compared with the
  // host's quantize_row and kept as the host replica.
  void append(int slot, int n, int position) {
    const std::size_t count = static_cast<std::size_t>(n) * config_.kv_dim();
    std::vector<float> x(2 * count);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t head = i / static_cast<std::size_t>(s_.head_dim);
      x[i] = normal(rng_) * (0.25f + static_cast<float>(head % 5));
    }
    x[3] = 60.0f;
    auto* dx = static_cast<float*>(cache_->reserved("x"));
    auto* rows = static_cast<std::uint8_t*>(cache_->reserved("rows"));
    const std::size_t bytes = static_cast<std::size_t>(n) * row_bytes_;
    cache_->synchronize_stream(stream_);
    cache_->copy_to_device(dx, x.data(), x.size() * sizeof(float));
    ops_->to_cache_rows(dx, n, rows);
    ops_->to_cache_rows(dx + count, n, rows + bytes);
    cache_->append(0, slot, rows, rows + bytes, n, stream_);
    cache_->synchronize_stream(stream_);
    std::vector<std::uint8_t> device(2 * bytes), host(2 * bytes);
    cache_->copy_to_host(device.data(), rows, device.size());
    for (int i = 0; i < 2 * n; ++i) {
      quantize_row(x.data() + static_cast<std::size_t>(i) * config_.kv_dim(), s_.kv_heads,
                   s_.head_dim, s_.dtype, host.data() + static_cast<std::size_t>(i) * row_bytes_);
    }
    for (std::size_t i = 0; i < host.size(); ++i) mismatched_bytes_ += host[i] != device[i];
    const std::size_t at = (static_cast<std::size_t>(slot) * s_.max_seq + position) * row_bytes_;
    std::copy(host.begin(), host.begin() + bytes, host_k_.begin() + at);
    std::copy(host.begin() + bytes, host.end(), host_v_.begin() + at);
  }

  std::vector<float> queries(int n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<std::size_t>(n) * config_.q_dim());
    for (float& e : q) e = normal(rng_);
    return q;
  }

  // Prefill attention of n new rows of `slot`: (device, host) outputs [n][heads][d].
  std::pair<std::vector<float>, std::vector<float>> prefill(int slot, int n,
                                                            const std::vector<float>& q) {
    const int first = cache_->length(slot);
    cache_->begin_step(counts(slot, n));
    const LayerView view = cache_->acquire(0, stream_);
    append(slot, n, first);
    auto [dq, dout] = upload(q);
    ops_->attention_prefill(dq, n, slot, first, config_.sliding_window, view, dout);
    cache_->release(0, stream_);
    cache_->end_step();
    std::vector<float> host;
    if (s_.builtin) {  // the host path's attention, which the built-in kernels are held to
      host.resize(q.size());
      host_ops_->attention_prefill(q.data(), n, slot, first, config_.sliding_window,
                                   host_view(view), host.data());
    }
    return {download(dout, q.size()), host};
  }

  // One decode step of `slots`, one new row each: (device, host) outputs [rows][heads][d].
  std::pair<std::vector<float>, std::vector<float>> decode(const std::vector<int>& slots,
                                                           const std::vector<float>& q) {
    const int n = static_cast<int>(slots.size());
    std::vector<std::int32_t> all(static_cast<std::size_t>(s_.slots), 0);
    std::vector<std::int32_t> host_rows(2 * static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      all[static_cast<std::size_t>(slots[static_cast<std::size_t>(i)])] = 1;
      host_rows[static_cast<std::size_t>(i)] = slots[static_cast<std::size_t>(i)];
      host_rows[static_cast<std::size_t>(n + i)] =
          cache_->length(slots[static_cast<std::size_t>(i)]);
    }
    auto* rows = static_cast<std::int32_t*>(cache_->reserved("decode_rows"));
    cache_->copy_to_device(rows, host_rows.data(), host_rows.size() * sizeof(std::int32_t));
    cache_->begin_step(all);
    const LayerView view = cache_->acquire(0, stream_);
    for (int i = 0; i < n; ++i) {
      append(slots[static_cast<std::size_t>(i)], 1, host_rows[static_cast<std::size_t>(n + i)]);
    }
    auto [dq, dout] = upload(q);
    DecodeRows decode_rows;
    decode_rows.slots = rows;
    decode_rows.positions = rows + n;
    decode_rows.host_slots = host_rows.data();
    decode_rows.host_positions = host_rows.data() + n;
    ops_->attention_decode(dq, n, decode_rows, config_.sliding_window, view, dout);
    cache_->release(0, stream_);
    cache_->end_step();
    std::vector<float> host;
    if (s_.builtin) {
      host.resize(q.size());
      host_ops_->attention_decode(q.data(), n, decode_rows, config_.sliding_window, host_view(view),
                                  host.data());
    }
    return {download(dout, q.size()), host};
  }

  // Worst |out - reference| / max|v| over the heads of query row `row` of q (at `position` of
  // `slot`), the reference in float64 over the rows dequantized and rounded to bf16, and the
  // query rounded to bf16, as the tiles hold them.
  double bf16_tile_error(const std::vector<float>& q, const std::vector<float>& out, int row,
                         int slot, int position) const {
    const int d = s_.head_dim;
    const int group = s_.heads / s_.kv_heads;
    const int first = s_.sliding_window > 0 ? std::max(0, position - s_.sliding_window + 1) : 0;
    const auto bf16 = [](float x) { return static_cast<double>(bf16_to_float(float_to_bf16(x))); };
    std::vector<float> k_row(static_cast<std::size_t>(config_.kv_dim())), v_row(k_row.size());
    const int keys = position + 1 - first;
    std::vector<double> k(static_cast<std::size_t>(keys) * config_.kv_dim()), v(k.size());
    double vmax = 0;
    for (int j = first; j <= position; ++j) {
      const std::size_t at = (static_cast<std::size_t>(slot) * s_.max_seq + j) * row_bytes_;
      dequantize_row(host_k_.data() + at, s_.kv_heads, d, s_.dtype, k_row.data());
      dequantize_row(host_v_.data() + at, s_.kv_heads, d, s_.dtype, v_row.data());
      for (std::size_t e = 0; e < k_row.size(); ++e) {
        k[static_cast<std::size_t>(j - first) * k_row.size() + e] = bf16(k_row[e]);
        v[static_cast<std::size_t>(j - first) * k_row.size() + e] = bf16(v_row[e]);
        vmax = std::max(vmax, std::fabs(bf16(v_row[e])));
      }
    }
    double worst = 0;
    std::vector<double> scores(static_cast<std::size_t>(keys));
    for (int h = 0; h < s_.heads; ++h) {
      const int g = h / group;
      const float* qh = q.data() + (static_cast<std::size_t>(row) * s_.heads + h) * d;
      double top = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        const double* kj = k.data() + (static_cast<std::size_t>(j) * s_.kv_heads + g) * d;
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += bf16(qh[e]) * kj[e];
        scores[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
        top = std::max(top, scores[static_cast<std::size_t>(j)]);
      }
      std::vector<double> o(static_cast<std::size_t>(d), 0.0);
      double sum = 0;
      for (int j = 0; j < keys; ++j) {
        const double p = std::exp(scores[static_cast<std::size_t>(j)] - top);
        sum += p;
        const double* vj = v.data() + (static_cast<std::size_t>(j) * s_.kv_heads + g) * d;
        for (int e = 0; e < d; ++e) o[static_cast<std::size_t>(e)] += p * vj[e];
      }
      const float* got = out.data() + (static_cast<std::size_t>(row) * s_.heads + h) * d;
      for (int e = 0; e < d; ++e) {
        worst = std::max(worst, std::fabs(got[e] - o[static_cast<std::size_t>(e)] / sum));
      }
    }
    return worst / vmax;
  }

  // Largest |v| over the rows held: the scale of the attention outputs.
  double vmax() const {
    double m = 0;
    std::vector<float> row(static_cast<std::size_t>(config_.kv_dim()));
    for (int s = 0; s < s_.slots; ++s) {
      for (int t = 0; t < cache_->length(s); ++t) {
        dequantize_row(host_v_.data() + (static_cast<std::size_t>(s) * s_.max_seq + t) * row_bytes_,
                       s_.kv_heads, s_.head_dim, s_.dtype, row.data());
        for (float e : row) m = std::max(m, std::fabs(static_cast<double>(e)));
      }
    }
    return m;
  }

 private:
  std::vector<std::int32_t> counts(int slot, int n) const {
    std::vector<std::int32_t> c(static_cast<std::size_t>(s_.slots), 0);
    c[static_cast<std::size_t>(slot)] = n;
    return c;
  }
  std::pair<float*, float*> upload(const std::vector<float>& q) {
    auto* dq = static_cast<float*>(cache_->reserved("q"));
    auto* dout = static_cast<float*>(cache_->reserved("out"));
    cache_->copy_to_device(dq, q.data(), q.size() * sizeof(float));
    return {dq, dout};
  }
  std::vector<float> download(const float* dout, std::size_t count) {
    cache_->synchronize_stream(stream_);
    std::vector<float> out(count);
    cache_->copy_to_host(out.data(), dout, count * sizeof(float));
    return out;
  }
  LayerView host_view(const LayerView& device) {
    LayerView v = device;
    v.k = host_k_.data();
    v.v = host_v_.data();
    return v;
  }

  QuantShape s_;
  std::mt19937 rng_;
  ModelConfig config_;
  AttentionKernels kernels_;
  std::size_t row_bytes_ = 0;
  std::unique_ptr<OffloadedStaticCache> cache_;
  void* stream_ = nullptr;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<HostOps> host_ops_;
  std::vector<std::uint8_t> host_k_, host_v_;
  int mismatched_bytes_ = 0;
};

double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

TEST(CudaQuant, QuantizedRowsAreTheHostsBitsAndAttendAsOnTheHost) {
  KVO_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kFP8E4M3, DType::kInt8}) {
    for (auto [kv_heads, head_dim] : {std::pair{8, 128}, {3, 64}}) {
      QuantShape s;
      s.dtype = dtype;
      s.kv_heads = kv_heads;
      s.heads = kv_heads * 4;
      s.head_dim = head_dim;
      QuantRig rig(s);  // the built-in kernels, asked for
      const std::string what = std::string(dtype_name(dtype)) + ", " + std::to_string(kv_heads) +
                               " kv heads of " + std::to_string(head_dim);
      EXPECT_FALSE(rig.kernels().any_flashinfer()) << what;
      // Slot 1: a 2500-token prefix in chunks, then a chunk attended; slot 0: a short prompt.
      for (int i = 0; i < 5; ++i) rig.prefill(1, 500, rig.queries(500));
      const auto [prefill_device, prefill_host] = rig.prefill(1, 300, rig.queries(300));
      rig.prefill(0, 40, rig.queries(40));
      const double tolerance = 1e-4 * rig.vmax();
      EXPECT_LE(worst_difference(prefill_device, prefill_host), tolerance) << what << " prefill";
      for (int step = 0; step < 3; ++step) {
        const auto [device, host] = rig.decode({1, 0}, rig.queries(2));
        EXPECT_LE(worst_difference(device, host), tolerance) << what << " decode " << step;
      }
      EXPECT_EQ(rig.mismatched_bytes(), 0) << what << ": device and host quantized differently";
    }
  }
}

// FlashInfer over bf16 tiles of 4096 keys: a prefix of 9000 keys (three tiles, the last one
// short) prefilled in chunks, a chunk attended after it, and decode steps of a long and a short
// slot; with a sliding window, one causal tile holds each chunk's window.
TEST(CudaQuant, FlashInferOverBf16TilesAttendsAsItsRoundedRows) {
  KVO_SKIP_WITHOUT_CUDA();
  if (!flashinfer_built()) GTEST_SKIP() << "this build has no FlashInfer";
  const double tolerance = 6 * 0x1p-8;
  for (DType dtype : {DType::kFP8E4M3, DType::kInt8}) {
    for (auto [kv_heads, head_dim, window] :
         {std::tuple{8, 128, 0}, std::tuple{3, 64, 0}, std::tuple{8, 128, 700}}) {
      QuantShape s;
      s.dtype = dtype;
      s.kv_heads = kv_heads;
      s.heads = kv_heads * 4;
      s.head_dim = head_dim;
      s.sliding_window = window;
      s.max_seq = 9600;
      s.builtin = false;
      QuantRig rig(s);
      const std::string what = std::string(dtype_name(dtype)) + ", " + std::to_string(kv_heads) +
                               " kv heads of " + std::to_string(head_dim) + ", window " +
                               std::to_string(window);
      ASSERT_TRUE(rig.kernels().dequant_tiles) << what;
      EXPECT_EQ(rig.kernels().tile_keys, kDequantTileKeys) << what;
      for (int i = 0; i < 18; ++i) rig.prefill(1, 500, rig.queries(500));
      const std::vector<float> q = rig.queries(300);
      const std::vector<float> out = rig.prefill(1, 300, q).first;
      for (int row : {0, 1, 77, 150, 298, 299}) {
        EXPECT_LE(rig.bf16_tile_error(q, out, row, 1, 9000 + row), tolerance)
            << what << " prefill row " << row;
      }
      rig.prefill(0, 40, rig.queries(40));
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> dq = rig.queries(2);
        const std::vector<float> device = rig.decode({1, 0}, dq).first;
        EXPECT_LE(rig.bf16_tile_error(dq, device, 0, 1, 9300 + step), tolerance)
            << what << " decode slot 1, step " << step;
        EXPECT_LE(rig.bf16_tile_error(dq, device, 1, 0, 40 + step), tolerance)
            << what << " decode slot 0, step " << step;
      }
      EXPECT_EQ(rig.mismatched_bytes(), 0) << what;
    }
  }
}

// The same path at the smallest shape that still crosses a tile: int8 K/V, 2 kv heads of 64, a
// prefix of 4100 keys (a full tile and 4 keys) and one decode step; small enough for
// compute-sanitizer's memcheck and racecheck (tools/device-check.sh runs it under both).
TEST(CudaQuant, FlashInferOverTwoBf16TilesAtASmallShape) {
  KVO_SKIP_WITHOUT_CUDA();
  if (!flashinfer_built()) GTEST_SKIP() << "this build has no FlashInfer";
  const double tolerance = 6 * 0x1p-8;
  QuantShape s;
  s.dtype = DType::kInt8;
  s.kv_heads = 2;
  s.heads = 8;
  s.head_dim = 64;
  s.max_seq = kDequantTileKeys + 64;
  s.builtin = false;
  QuantRig rig(s);
  ASSERT_TRUE(rig.kernels().dequant_tiles);
  for (int done = 0; done < kDequantTileKeys - 60;) {  // in chunks within max_rows
    const int n = std::min(s.max_rows, kDequantTileKeys - 60 - done);
    rig.prefill(1, n, rig.queries(n));
    done += n;
  }
  const std::vector<float> q = rig.queries(64);
  const std::vector<float> out = rig.prefill(1, 64, q).first;
  for (int row : {0, 59, 60, 63}) {  // rows before, at and past the tile's edge
    EXPECT_LE(rig.bf16_tile_error(q, out, row, 1, kDequantTileKeys - 60 + row), tolerance)
        << "prefill row " << row;
  }
  rig.prefill(0, 10, rig.queries(10));
  const std::vector<float> dq = rig.queries(2);
  const std::vector<float> device = rig.decode({1, 0}, dq).first;
  EXPECT_LE(rig.bf16_tile_error(dq, device, 0, 1, kDequantTileKeys + 4), tolerance);
  EXPECT_LE(rig.bf16_tile_error(dq, device, 1, 0, 10), tolerance);
  EXPECT_EQ(rig.mismatched_bytes(), 0);
}

}  // namespace
}  // namespace kvo::model
