// The CUDA path's attention alone, against a float64 reference on the host: decode (every slot in
// one launch, each with its own length, long prefixes split over the GPU) and prefill (a chunk of
// rows after a prefix, causal from the bottom right, sliding windows), through FlashInfer where
// it serves the shape and the built-in kernels elsewhere. Skipped without a GPU.
//
// Error bound. K, V and the queries are drawn as values the cache's type holds exactly, and the
// reference reads those same values, so what remains is the kernels' own arithmetic. With u the
// type's unit roundoff (2^-8 for bf16, 2^-11 for f16):
// - scores q.k: products of two bf16/f16 values are exact in f32; the f32 sums over head_dim
//   add about head_dim * 2^-24 * sum|q_i k_i|, far below what follows;
// - FlashInfer prefill rounds the softmax weights p_j to the K/V type before its P.V product on
//   tensor cores, and sums the rounded weights for the denominator: a convex combination of the
//   v_j perturbed by at most u relative per weight, which moves the output by at most
//   2u * max|v|; decode keeps p in f32;
// - when the keys are split over the GPU, each split's partial output is stored in the type
//   (u * max|v|) before the merge, and the merged output is rounded once more (u * max|v|).
// Hence |o - o_ref| <= 4u * max|v| per element, the tolerance used. The built-in kernels compute
// in f32 throughout: 1e-4 * max|v| covers f32 sums over a few thousand keys.
//
// Soft-capped scores (Gemma 2): the built-in kernels use tanhf (a few ulp); FlashInfer uses the
// tanh.approx.f32 instruction, about 2^-11 relative error by the PTX ISA, so each capped score
// c * tanh(s / c) may move by delta = 2^-10 * |capped score| (twice that, to be safe). Moving
// each softmax weight by at most a factor e^delta moves the convex combination by at most
// (e^(2 delta) - 1) * max|v|, which the check adds to the bound for FlashInfer with a cap.
//
// Masks are what such a bound could hide (one key of 8K moves a smooth softmax by ~1e-4), so
// every case also runs with sharp scores (standard deviation 5): the softmax then rests on a few
// keys, and admitting one masked key or dropping one admitted key moves many outputs by a large
// part of max|v|, far past 4u.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_required.hpp"
#include "kvoffload/cache.hpp"
#include "model/common/numerics.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/memory_plan.hpp"

namespace kvo::model {
namespace {

struct Shape {
  int heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  DType dtype = DType::kBF16;
  int slots = 1;
  int max_seq = 4096;
  int sliding_window = 0;
  int max_rows = 64;  // the largest chunk
  double score_std = 1;
  float softcap = 0;          // Gemma 2's attn_logit_softcapping; 0: none
  float pre_attn_scalar = 0;  // Gemma's query_pre_attn_scalar; 0: head_dim
  // > 0: attention reads V from a copy whose rows carry this many more elements than K's, so the
  // view's V strides differ from its K strides (the built-in kernels only: FlashInfer reads both
  // through one set).
  int v_pad = 0;
};

std::uint16_t to_bits(float x, DType t) {
  return t == DType::kBF16 ? float_to_bf16(x) : float_to_f16(x);
}
float from_bits(std::uint16_t b, DType t) {
  return t == DType::kBF16 ? bf16_to_float(b) : f16_to_float(b);
}

// One layer of K/V on the CUDA backend, filled through the public protocol, with the model's
// CUDA ops over it and a host copy of every row for the reference.
class AttentionRig {
 public:
  explicit AttentionRig(const Shape& s)
      : s_(s), rng_(static_cast<std::uint64_t>(s.head_dim * 7 + s.heads)) {
    config_ = preset("tiny");
    config_.heads = s.heads;
    config_.kv_heads = s.kv_heads;
    config_.head_dim = s.head_dim;
    config_.sliding_window = s.sliding_window;
    config_.attn_softcap = s.softcap;
    if (s.pre_attn_scalar > 0) {  // Gemma's field, which Gemma's family reads
      config_.architecture = "Gemma2ForCausalLM";
      config_.model_type = "gemma2";
      config_.query_pre_attn_scalar = s.pre_attn_scalar;
    }
    const AttentionKernels kernels =
        choose_attention_kernels(config_, s.dtype, s.slots, s.max_seq, s.max_rows);
    layout_ = std::make_unique<WorkspaceLayout>(config_, s.dtype, s.dtype, s.max_rows, s.slots,
                                                s.max_seq, kernels);
    const std::uint64_t row_elems = static_cast<std::uint64_t>(s.kv_heads) * s.head_dim;
    const std::uint64_t q_elems = static_cast<std::uint64_t>(s.max_rows) * s.heads * s.head_dim;
    rows_capacity_ = static_cast<std::uint64_t>(s.max_seq);
    CacheConfig c;
    c.layers = 1;
    c.kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.max_seq = s.max_seq;
    c.slots = s.slots;
    c.dtype = s.dtype;
    c.backend = BackendKind::kCuda;
    c.reserved = {{"workspace", layout_->bytes},
                  {"rows", 2 * rows_capacity_ * row_elems * dtype_size(s.dtype)},
                  {"q", q_elems * sizeof(float)},
                  {"out", q_elems * sizeof(float)},
                  {"decode_rows", 2 * static_cast<std::uint64_t>(s.slots) * sizeof(std::int32_t)}};
    if (s.v_pad > 0) c.reserved.push_back({"v_padded", padded_v_elements() * dtype_size(s.dtype)});
    cache_ = std::make_unique<OffloadedStaticCache>(c);
    stream_ = cache_->create_stream();
    OpsShape shape;
    shape.config = config_;
    shape.weight_dtype = s.dtype;
    shape.kv_dtype = s.dtype;
    shape.max_rows = s.max_rows;
    shape.max_decode_rows = s.slots;
    shape.max_seq = s.max_seq;
    shape.kernels = kernels;
    ops_ = make_cuda_ops(shape, stream_, cache_->reserved("workspace"));
    k_.assign(static_cast<std::size_t>(s.slots), {});
    v_.assign(static_cast<std::size_t>(s.slots), {});
  }
  ~AttentionRig() {
    cache_->synchronize_stream(stream_);
    ops_.reset();
    cache_->destroy_stream(stream_);
  }

  bool flashinfer_prefill() const { return layout_->kernels.flashinfer_prefill; }
  bool flashinfer_decode() const { return layout_->kernels.flashinfer_decode; }
  // The bound on error() (the header's derivation): the last error() call's tanh slack added for
  // FlashInfer with a cap.
  double tolerance(bool flashinfer) const {
    if (!flashinfer) return 1e-4;  // f32 sums over up to a few thousand keys
    return 4 * (s_.dtype == DType::kBF16 ? 0x1p-8 : 0x1p-11) + tanh_slack_;
  }

  // Draws n K/V rows (values of the cache type) for `slot`.
  void draw_rows(int slot, int n, std::vector<std::uint16_t>& k, std::vector<std::uint16_t>& v) {
    // Keys carry the score scale: score = q.k / sqrt(d) has standard deviation score_std when
    // q and k entries have standard deviation sqrt(score_std).
    std::normal_distribution<float> key(0.0f, static_cast<float>(std::sqrt(s_.score_std)));
    std::normal_distribution<float> value(0.0f, 1.0f);
    const std::size_t count = static_cast<std::size_t>(n) * s_.kv_heads * s_.head_dim;
    k.resize(count);
    v.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      k[i] = to_bits(key(rng_), s_.dtype);
      v[i] = to_bits(value(rng_), s_.dtype);
    }
    auto& hk = k_[static_cast<std::size_t>(slot)];
    auto& hv = v_[static_cast<std::size_t>(slot)];
    hk.insert(hk.end(), k.begin(), k.end());
    hv.insert(hv.end(), v.begin(), v.end());
  }

  // Queries [n][heads][d], f32 values that the cache type holds exactly.
  std::vector<float> draw_queries(int n) {
    std::normal_distribution<float> dist(0.0f, static_cast<float>(std::sqrt(s_.score_std)));
    std::vector<float> q(static_cast<std::size_t>(n) * s_.heads * s_.head_dim);
    for (float& x : q) x = from_bits(to_bits(dist(rng_), s_.dtype), s_.dtype);
    return q;
  }

  // Appends n fresh rows to `slot` in a step of its own, without attention.
  void fill(int slot, int n) {
    std::vector<std::int32_t> counts(static_cast<std::size_t>(s_.slots), 0);
    counts[static_cast<std::size_t>(slot)] = n;
    std::vector<std::uint16_t> k, v;
    draw_rows(slot, n, k, v);
    cache_->begin_step(counts);
    cache_->acquire(0, stream_);
    append(slot, k, v, n);
    cache_->release(0, stream_);
    cache_->end_step();
  }

  // Prefill attention of n new rows of `slot`, as the decoder runs it: the rows are appended,
  // then attended. Returns out [n][heads][d].
  std::vector<float> prefill(int slot, int n, const std::vector<float>& q) {
    const int first = cache_->length(slot);
    std::vector<std::int32_t> counts(static_cast<std::size_t>(s_.slots), 0);
    counts[static_cast<std::size_t>(slot)] = n;
    std::vector<std::uint16_t> k, v;
    draw_rows(slot, n, k, v);
    cache_->begin_step(counts);
    LayerView view = cache_->acquire(0, stream_);
    append(slot, k, v, n);
    view = with_padded_v(view);
    float* dq = static_cast<float*>(cache_->reserved("q"));
    float* dout = static_cast<float*>(cache_->reserved("out"));
    cache_->copy_to_device(dq, q.data(), q.size() * sizeof(float));
    ops_->attention_prefill(dq, n, slot, first, config_.sliding_window, view, dout);
    cache_->release(0, stream_);
    cache_->end_step();
    cache_->synchronize_stream(stream_);
    std::vector<float> out(q.size());
    cache_->copy_to_host(out.data(), dout, out.size() * sizeof(float));
    return out;
  }

  // One decode step: a new row for each slot in `slots`, then attention of its query. Returns
  // out [rows][heads][d].
  std::vector<float> decode(const std::vector<int>& slots, const std::vector<float>& q) {
    const int n = static_cast<int>(slots.size());
    std::vector<std::int32_t> counts(static_cast<std::size_t>(s_.slots), 0);
    std::vector<std::int32_t> host_rows(2 * static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      counts[static_cast<std::size_t>(slots[static_cast<std::size_t>(i)])] = 1;
      host_rows[static_cast<std::size_t>(i)] = slots[static_cast<std::size_t>(i)];
      host_rows[static_cast<std::size_t>(n + i)] =
          cache_->length(slots[static_cast<std::size_t>(i)]);
    }
    auto* rows = static_cast<std::int32_t*>(cache_->reserved("decode_rows"));
    cache_->copy_to_device(rows, host_rows.data(), host_rows.size() * sizeof(std::int32_t));
    cache_->begin_step(counts);
    LayerView view = cache_->acquire(0, stream_);
    for (int slot : slots) {
      std::vector<std::uint16_t> k, v;
      draw_rows(slot, 1, k, v);
      append(slot, k, v, 1);
    }
    view = with_padded_v(view);
    float* dq = static_cast<float*>(cache_->reserved("q"));
    float* dout = static_cast<float*>(cache_->reserved("out"));
    cache_->copy_to_device(dq, q.data(), q.size() * sizeof(float));
    DecodeRows decode_rows;
    decode_rows.slots = rows;
    decode_rows.positions = rows + n;
    decode_rows.host_slots = host_rows.data();
    decode_rows.host_positions = host_rows.data() + n;
    ops_->attention_decode(dq, n, decode_rows, config_.sliding_window, view, dout);
    cache_->release(0, stream_);
    cache_->end_step();
    cache_->synchronize_stream(stream_);
    std::vector<float> out(q.size());
    cache_->copy_to_host(out.data(), dout, out.size() * sizeof(float));
    return out;
  }

  // Worst |out - reference| / max|v| over the heads of query row `row` (at `position` of `slot`);
  // with a cap, also notes the row's tanh slack for tolerance().
  double error(const std::vector<float>& q, const std::vector<float>& out, int row, int slot,
               int position) {
    const int d = s_.head_dim;
    const int group = s_.heads / s_.kv_heads;
    const auto& hk = k_[static_cast<std::size_t>(slot)];
    const auto& hv = v_[static_cast<std::size_t>(slot)];
    const int first = s_.sliding_window > 0 ? std::max(0, position - s_.sliding_window + 1) : 0;
    double worst = 0, vmax = 0, top_capped = 0;
    const double scale = config_.attention_scale();
    std::vector<double> scores(static_cast<std::size_t>(position + 1));
    for (int h = 0; h < s_.heads; ++h) {
      const int g = h / group;
      const float* qh = q.data() + (static_cast<std::size_t>(row) * s_.heads + h) * d;
      double top = -INFINITY;
      for (int j = first; j <= position; ++j) {
        const std::uint16_t* kj = hk.data() + (static_cast<std::size_t>(j) * s_.kv_heads + g) * d;
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += static_cast<double>(qh[e]) * from_bits(kj[e], s_.dtype);
        double score = dot * scale;
        if (s_.softcap > 0) {
          score = s_.softcap * std::tanh(score / s_.softcap);
          top_capped = std::max(top_capped, std::fabs(score));
        }
        scores[static_cast<std::size_t>(j)] = score;
        top = std::max(top, score);
      }
      std::vector<double> o(static_cast<std::size_t>(d), 0.0);
      double sum = 0;
      for (int j = first; j <= position; ++j) {
        const double p = std::exp(scores[static_cast<std::size_t>(j)] - top);
        sum += p;
        const std::uint16_t* vj = hv.data() + (static_cast<std::size_t>(j) * s_.kv_heads + g) * d;
        for (int e = 0; e < d; ++e) {
          const double ve = from_bits(vj[e], s_.dtype);
          o[static_cast<std::size_t>(e)] += p * ve;
          vmax = std::max(vmax, std::fabs(ve));
        }
      }
      const float* got = out.data() + (static_cast<std::size_t>(row) * s_.heads + h) * d;
      for (int e = 0; e < d; ++e) {
        worst = std::max(worst, std::fabs(got[e] - o[static_cast<std::size_t>(e)] / sum));
      }
    }
    tanh_slack_ = s_.softcap > 0 ? std::expm1(2 * 0x1p-10 * top_capped) : 0;
    return worst / vmax;
  }

  int length(int slot) const { return cache_->length(slot); }

 private:
  std::uint64_t padded_v_elements() const {
    return static_cast<std::uint64_t>(s_.slots) * s_.max_seq *
           (static_cast<std::uint64_t>(s_.kv_heads) * s_.head_dim + s_.v_pad);
  }
  // With v_pad: `view` reading V from a copy of every row drawn so far, each followed by v_pad
  // elements of 1000 (what attention would take in if it read V through K's strides).
  LayerView with_padded_v(LayerView view) {
    if (s_.v_pad == 0) return view;
    const std::int64_t row = static_cast<std::int64_t>(s_.kv_heads) * s_.head_dim + s_.v_pad;
    std::vector<std::uint16_t> padded(padded_v_elements(), to_bits(1000.0f, s_.dtype));
    for (int slot = 0; slot < s_.slots; ++slot) {
      const auto& hv = v_[static_cast<std::size_t>(slot)];
      const std::size_t width = static_cast<std::size_t>(s_.kv_heads) * s_.head_dim;
      for (std::size_t t = 0; t * width < hv.size(); ++t) {
        std::copy_n(hv.begin() + static_cast<std::ptrdiff_t>(t * width), width,
                    padded.begin() + (static_cast<std::ptrdiff_t>(slot) * s_.max_seq +
                                      static_cast<std::ptrdiff_t>(t)) *
                                         row);
      }
    }
    void* device = cache_->reserved("v_padded");
    cache_->copy_to_device(device, padded.data(), padded.size() * sizeof(std::uint16_t));
    view.v = device;
    view.v_token_stride = row;
    view.v_slot_stride = row * s_.max_seq;
    view.layout.v_row_bytes = static_cast<std::uint64_t>(row) * dtype_size(s_.dtype);
    return view;
  }
  void append(int slot, const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
              int n) {
    const std::size_t bytes = k.size() * sizeof(std::uint16_t);
    auto* rows = static_cast<std::byte*>(cache_->reserved("rows"));
    cache_->synchronize_stream(stream_);  // earlier appends have read the staging rows
    cache_->copy_to_device(rows, k.data(), bytes);
    cache_->copy_to_device(rows + bytes, v.data(), bytes);
    cache_->append(0, slot, rows, rows + bytes, n, stream_);
  }

  Shape s_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  std::unique_ptr<WorkspaceLayout> layout_;
  std::uint64_t rows_capacity_ = 0;
  std::unique_ptr<OffloadedStaticCache> cache_;
  void* stream_ = nullptr;
  std::unique_ptr<Ops> ops_;
  std::vector<std::vector<std::uint16_t>> k_, v_;  // [slot] -> [token][kv_head][d] bits
  double tanh_slack_ = 0;
};

// Prefill of `chunk` rows after a prefix of `prefix` keys, checked at a spread of rows.
void check_prefill(Shape s, int prefix, int chunk, bool expect_flashinfer) {
  s.max_rows = std::max(s.max_rows, chunk);
  for (double score_std : {1.0, 5.0}) {
    s.score_std = score_std;
    AttentionRig rig(s);
    EXPECT_EQ(rig.flashinfer_prefill(), expect_flashinfer);
    const int slot = s.slots - 1;
    if (prefix > 0) rig.fill(slot, prefix);
    const std::vector<float> q = rig.draw_queries(chunk);
    const std::vector<float> out = rig.prefill(slot, chunk, q);
    // About 40 rows spread over the chunk, its first and last among them.
    std::vector<int> rows;
    for (int row = 0; row < chunk; row += std::max(1, chunk / 40)) rows.push_back(row);
    if (rows.back() != chunk - 1) rows.push_back(chunk - 1);
    for (int row : rows) {
      const double error = rig.error(q, out, row, slot, prefix + row);  // before tolerance()
      EXPECT_LE(error, rig.tolerance(expect_flashinfer))
          << "row " << row << " of " << chunk << " after " << prefix << ", score std " << score_std;
    }
  }
}

// Decode steps over slots of different lengths (lengths[s] keys before the first step).
void check_decode(Shape s, const std::vector<int>& lengths, bool expect_flashinfer) {
  s.slots = static_cast<int>(lengths.size());
  for (double score_std : {1.0, 5.0}) {
    s.score_std = score_std;
    AttentionRig rig(s);
    EXPECT_EQ(rig.flashinfer_decode(), expect_flashinfer);
    for (int slot = 0; slot < s.slots; ++slot) {
      if (lengths[static_cast<std::size_t>(slot)] > 0)
        rig.fill(slot, lengths[static_cast<std::size_t>(slot)]);
    }
    // Every slot, then every other slot (rows need not be all slots, nor in order of length).
    std::vector<int> all(static_cast<std::size_t>(s.slots));
    for (int i = 0; i < s.slots; ++i) all[static_cast<std::size_t>(i)] = s.slots - 1 - i;
    std::vector<int> some;
    for (int i = 0; i < s.slots; i += 2) some.push_back(i);
    for (const auto& rows : {all, some, all}) {
      std::vector<int> positions;
      for (int slot : rows) positions.push_back(rig.length(slot));
      const std::vector<float> q = rig.draw_queries(static_cast<int>(rows.size()));
      const std::vector<float> out = rig.decode(rows, q);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const double error = rig.error(q, out, static_cast<int>(i), rows[i], positions[i]);
        EXPECT_LE(error, rig.tolerance(expect_flashinfer))
            << "slot " << rows[i] << " at " << positions[i] << ", score std " << score_std;
      }
    }
  }
}

Shape llama3() {
  return Shape{};  // 32 heads, 8 KV heads (GQA group 4), head_dim 128, bf16
}
Shape smollm2() {
  Shape s;
  s.heads = 9;
  s.kv_heads = 3;  // group 3
  s.head_dim = 64;
  return s;
}

TEST(CudaAttention, KernelChoiceFollowsTheShape) {
  // No GPU needed: the choice is a function of the shape and the build.
  const ModelConfig c = preset("llama3-8b");
  const auto choose = [](const ModelConfig& m, DType t, int max_seq) {
    return choose_attention_kernels(m, t, 1, max_seq, 512);
  };
  const AttentionKernels k = choose(c, DType::kBF16, 131072);
  EXPECT_EQ(k.flashinfer_decode, flashinfer_built());
  EXPECT_EQ(k.flashinfer_prefill, flashinfer_built());
  if (!flashinfer_built()) {
    EXPECT_NE(k.describe(c, DType::kBF16).find("KVO_WITH_FLASHINFER=OFF"), std::string::npos);
    return;
  }
  EXPECT_EQ(k.page_size, 64);
  EXPECT_EQ(choose(c, DType::kBF16, 4101).page_size, 1);
  EXPECT_EQ(choose(c, DType::kBF16, 4104).page_size, 8);
  EXPECT_FALSE(choose(c, DType::kF32, 4096).any_flashinfer());
  // fp8 and int8 rows: both phases through FlashInfer over bf16 tiles, any GQA group, a tile long
  // enough for a chunk and a sliding window before it; never with the built-in kernels asked for.
  for (DType t : {DType::kFP8E4M3, DType::kInt8}) {
    const AttentionKernels q = choose(c, t, 131072);
    EXPECT_TRUE(q.dequant_tiles && q.flashinfer_prefill && q.flashinfer_decode);
    EXPECT_EQ(q.tile_keys, kDequantTileKeys);
    EXPECT_NE(q.describe(c, t).find("bf16 tiles of 4096 keys"), std::string::npos)
        << q.describe(c, t);
    EXPECT_TRUE(choose(preset("qwen2.5-7b"), t, 4096).dequant_tiles);
    ModelConfig windowed = preset("mistral-7b");
    windowed.sliding_window = 4096;
    EXPECT_EQ(choose_attention_kernels(windowed, t, 1, 32768, 2048).tile_keys, 2048 + 4095);
    EXPECT_FALSE(choose_attention_kernels(c, t, 1, 4096, 512, true).any_flashinfer());
  }
  ModelConfig odd = c;
  odd.head_dim = 96;
  EXPECT_NE(choose(odd, DType::kBF16, 4096).prefill_reason.find("head_dim"), std::string::npos);
  // Gemma: head_dim 256, soft-capped scores (Gemma 2), windows; every cache type it may use.
  for (const char* name : {"gemma3-12b"}) {
    ModelConfig g = preset(name);
    EXPECT_EQ(g.head_dim, 256);
    for (float cap : {0.0f, 50.0f}) {
      g.attn_softcap = cap;
      for (DType t : {DType::kBF16, DType::kF16}) {
        const AttentionKernels gk = choose(g, t, 32768);
        EXPECT_TRUE(gk.flashinfer_prefill && gk.flashinfer_decode) << gk.describe(g, t);
      }
      EXPECT_TRUE(choose(g, DType::kInt8, 32768).dequant_tiles);
    }
  }
  // Qwen2.5-7B: 28 query heads on 4 KV heads. FlashInfer prefills any group; its decode does not
  // serve 7.
  const AttentionKernels qwen = choose(preset("qwen2.5-7b"), DType::kBF16, 4096);
  EXPECT_TRUE(qwen.flashinfer_prefill);
  EXPECT_FALSE(qwen.flashinfer_decode);
  EXPECT_NE(qwen.decode_reason.find("GQA"), std::string::npos);
  EXPECT_NE(qwen.describe(preset("qwen2.5-7b"), DType::kBF16).find("built-in decode"),
            std::string::npos);
  EXPECT_FALSE(choose(c, DType::kBF16, 1 << 22).any_flashinfer());  // 32-bit offsets
  EXPECT_FALSE(choose_attention_kernels(c, DType::kBF16, 1, 4096, 512, true).any_flashinfer());
}

TEST(CudaAttention, DecodeLlama3ShapeOverLongAndShortSlots) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s = llama3();
  s.max_seq = 33024;  // pages of 64 tokens
  // 33000 keys: FlashInfer splits the sequence over the GPU; 1 key: a slot's first token.
  check_decode(s, {0, 4100, 33000, 17}, flashinfer_built());
}

TEST(CudaAttention, DecodeWithOneTokenPages) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s = smollm2();
  s.max_seq = 9003;  // odd: pages of one token (slot 0 ends at 9003 after three steps)
  check_decode(s, {9000, 250, 3}, flashinfer_built());
}

TEST(CudaAttention, DecodeF16GroupOf8AndSlidingWindow) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s;
  s.heads = 16;
  s.kv_heads = 2;
  s.dtype = DType::kF16;
  s.max_seq = 2048;
  s.sliding_window = 100;
  check_decode(s, {1000, 99, 100, 101}, flashinfer_built());
}

TEST(CudaAttention, PrefillChunkAfterALongPrefix) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s = llama3();
  s.max_seq = 8704;
  check_prefill(s, 8000, 512, flashinfer_built());  // keys of several 1024-key blocks
}

TEST(CudaAttention, PrefillFromEmptyAndSmallChunks) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s = smollm2();
  s.max_seq = 1024;
  check_prefill(s, 0, 300, flashinfer_built());
  check_prefill(s, 0, 1, flashinfer_built());
  check_prefill(s, 33, 7, flashinfer_built());
}

TEST(CudaAttention, PrefillWithSlidingWindowAndNoGrouping) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s;
  s.heads = 4;
  s.kv_heads = 4;
  s.head_dim = 64;
  s.dtype = DType::kF16;
  s.max_seq = 1024;
  s.sliding_window = 100;
  check_prefill(s, 500, 200, flashinfer_built());
}

// Gemma 2 9B's attention: 16 heads on 8 KV heads, head_dim 256, scores scaled by
// query_pre_attn_scalar 224 and capped at 50, and its 4096-key window (here 300). Sharp scores
// (score std 5) bend the cap's tanh; a cap of 5 bends it everywhere.
Shape gemma2() {
  Shape s;
  s.heads = 16;
  s.kv_heads = 8;
  s.head_dim = 256;
  s.pre_attn_scalar = 224;
  s.softcap = 50;
  s.sliding_window = 300;
  return s;
}

TEST(CudaAttention, SoftCappedHeadDim256DecodeAndPrefill) {
  KVO_SKIP_WITHOUT_CUDA();
  for (float cap : {50.0f, 5.0f}) {
    Shape s = gemma2();
    s.softcap = cap;
    s.max_seq = 4096;
    check_decode(s, {2000, 299, 3}, flashinfer_built());
    check_prefill(s, 1000, 256, flashinfer_built());
    s.sliding_window = 0;  // a full layer
    check_decode(s, {3000, 17}, flashinfer_built());
    check_prefill(s, 0, 200, flashinfer_built());
  }
}

TEST(CudaAttention, HeadDim256WithoutCapF16) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s = gemma2();  // Gemma 3's shape: no cap, its 1024-key window (here 100)
  s.softcap = 0;
  s.pre_attn_scalar = 0;
  s.sliding_window = 100;
  s.dtype = DType::kF16;
  s.max_seq = 2048;
  check_decode(s, {1500, 40}, flashinfer_built());
  check_prefill(s, 700, 130, flashinfer_built());
}

TEST(CudaAttention, BuiltInKernelsServeWhatFlashInferDoesNot) {
  KVO_SKIP_WITHOUT_CUDA();
  // head_dim 96 has no FlashInfer instantiation (f32 caches neither: CudaModel covers those).
  Shape odd = llama3();
  odd.head_dim = 96;
  odd.max_seq = 2048;
  check_prefill(odd, 1100, 64, false);
  check_decode(odd, {1500, 3}, false);
}

TEST(CudaAttention, BuiltInKernelsReadVThroughItsOwnStrides) {
  KVO_SKIP_WITHOUT_CUDA();
  // A view whose V rows are 40 elements wider apart than its K rows: built-in decode (GQA group 7)
  // and built-in prefill (head_dim 96) read V where V's strides say.
  Shape qwen;
  qwen.heads = 28;
  qwen.kv_heads = 4;
  qwen.max_seq = 1536;
  qwen.v_pad = 40;
  check_decode(qwen, {1200, 30}, false);
  Shape odd = llama3();
  odd.head_dim = 96;
  odd.max_seq = 2048;
  odd.v_pad = 40;
  check_prefill(odd, 1100, 64, false);
  check_decode(odd, {1500, 3}, false);
}

TEST(CudaAttention, GroupOf7PrefillsWithFlashInferAndDecodesBuiltIn) {
  KVO_SKIP_WITHOUT_CUDA();
  Shape s;  // Qwen2.5-7B's attention shape
  s.heads = 28;
  s.kv_heads = 4;
  s.max_seq = 1536;
  check_prefill(s, 700, 300, flashinfer_built());
  check_decode(s, {1200, 30}, false);
}

}  // namespace
}  // namespace kvo::model
