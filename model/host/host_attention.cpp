#include "model/host/host_attention.hpp"

#include "model/host/blas.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "model/decoder/ops.hpp"
#include "model/host/host_kernels.hpp"

namespace kvo::model {
namespace {

std::int64_t elem_bytes(DType type) {
  return type == DType::kF32 ? 4 : is_quantized(type) ? 1 : 2;
}

// Where one kv head's rows of K or V are: rows start every token_stride elements from `rows` (the
// first key's row), the head head_offset elements into each; quantized rows keep their scales
// scale_offset bytes in.
struct HeadRows {
  const char* rows = nullptr;
  std::int64_t token_stride = 0;
  std::int64_t head_offset = 0;
  std::int64_t scale_offset = 0;
  int kv_head = 0;
};

// Keys [0, keys) of one kv head as an f32 matrix: in place (leading dimension = the token
// stride) when the cache is f32, else converted, or dequantized, into `buffer` (leading dimension
// head_dim).
const float* key_block(const HeadRows& h, int keys, int head_dim, DType type, float* buffer,
                       int* ld) {
  const std::int64_t bytes = elem_bytes(type);
  if (type == DType::kF32) {
    *ld = static_cast<int>(h.token_stride);
    return reinterpret_cast<const float*>(h.rows) + h.head_offset;
  }
  for (int j = 0; j < keys; ++j) {
    const char* row = h.rows + j * h.token_stride * bytes;
    float* out = buffer + static_cast<std::int64_t>(j) * head_dim;
    if (is_quantized(type)) {
      const float scale = kv_scale(row, 0, h.scale_offset, h.kv_head);
      for (int e = 0; e < head_dim; ++e) out[e] = load_elem(row, h.head_offset + e, type) * scale;
    } else {
      kernels::to_f32(row + h.head_offset * bytes, type, head_dim, out);
    }
  }
  *ld = head_dim;
  return buffer;
}

}  // namespace

HostAttention::HostAttention(const ModelConfig& config, DType type, ThreadPool& pool,
                             HostAttentionScratch scratch)
    : config_(config),
      type_(type),
      pool_(pool),
      group_(config.heads / config.kv_heads),
      scale_(static_cast<float>(config.attention_scale())),
      softcap_(static_cast<float>(config.attn_softcap)),
      scratch_(std::move(scratch)) {
  make_decode();
}

HostAttention::HostAttention(const ModelConfig& config, DType type, int max_decode_rows,
                             ThreadPool& pool)
    : HostAttention(config, type, pool, HostAttentionScratch{}) {
  scratch_ = carve_own(&own_, [&](HostCarver& carver) {
    return HostAttentionScratch::carve(carver, config, type, max_decode_rows, pool.threads());
  });
  make_decode();
}

void HostAttention::make_decode() {
  attend::DecodeShape shape;
  shape.heads = config_.heads;
  shape.kv_heads = config_.kv_heads;
  shape.head_dim = config_.head_dim;
  shape.type = type_;
  shape.scale = scale_;
  shape.softcap = softcap_;
  decode_ = std::make_unique<attend::DecodeAttention>(shape, pool_, scratch_.decode);
}

double HostAttention::measure_rate(const ModelConfig& config, DType type, ThreadPool& pool,
                                   std::uint64_t bytes) {
  const std::uint64_t row = kv_row_bytes(type, config.kv_heads, config.head_dim);
  const int rows = static_cast<int>(std::max<std::uint64_t>(1, bytes / (2 * row)));
  CacheConfig cache;
  cache.layers = 1;
  cache.slots = 1;
  cache.max_seq = rows;
  cache.kv_heads = config.kv_heads;
  cache.head_dim = config.head_dim;
  cache.dtype = type;
  const KvLayout layout = kv_layout(cache);
  // Zeros: real memory (written), and rows of any type that attend to a finite output.
  std::vector<std::byte> k(layout.k_tensor_bytes), v(layout.v_tensor_bytes);
  const LayerView view = LayerView::of(layout, k.data(), v.data());
  HostAttention attention(config, type, 1, pool);
  std::vector<float> q(static_cast<std::size_t>(config.q_dim()), 0.5f), out(q.size());
  const std::int32_t slot = 0, position = rows - 1;
  double best = 0;
  for (int round = 0; round < 4; ++round) {
    const auto start = std::chrono::steady_clock::now();
    attention.decode(q.data(), 1, &slot, &position, 0, view, out.data());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (round > 0 && s > 0) best = std::max(best, 2.0 * static_cast<double>(rows * row) / s);
  }
  return best;
}

void HostAttention::prefill(const float* q, int n, int slot, int first_position, int window,
                            const LayerView& view, float* out) {
  const int blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int kv_heads = config_.kv_heads;
  // The last query blocks see the most keys: hand them out first.
  pool_.run(blocks * kv_heads, [&](int task, int thread) {
    prefill_block(q, n, slot, first_position, window, view, task % kv_heads,
                  blocks - 1 - task / kv_heads, scratch_.prefill[static_cast<std::size_t>(thread)],
                  out);
  });
}

void HostAttention::prefill_block(const float* q, int n, int slot, int first_position, int window,
                                  const LayerView& view, int kv_head, int block, PrefillScratch& s,
                                  float* out) {
  const int d = config_.head_dim;
  const int heads = config_.heads;
  const int t0 = block * kQueryBlock;
  const int tokens = std::min(kQueryBlock, n - t0);
  const int rows = tokens * group_;
  // Queries of the group packed as row t * group + r, and the keys each row sees.
  for (int t = 0; t < tokens; ++t) {
    const int pos = first_position + t0 + t;
    for (int r = 0; r < group_; ++r) {
      const int i = t * group_ + r;
      const float* src = q + (static_cast<std::int64_t>(t0 + t) * heads + kv_head * group_ + r) * d;
      std::copy(src, src + d, s.q.data() + static_cast<std::int64_t>(i) * d);
      s.first[static_cast<std::size_t>(i)] = first_key(window, pos);
      s.last[static_cast<std::size_t>(i)] = pos;
      s.state[static_cast<std::size_t>(i)] = SoftmaxState{};
    }
  }
  std::fill(s.out.begin(), s.out.begin() + static_cast<std::int64_t>(rows) * d, 0.0f);
  const int key_begin = first_key(window, first_position + t0);
  const int key_end = first_position + t0 + tokens;  // exclusive
  const std::int64_t bytes = elem_bytes(type_);
  for (int key0 = key_begin; key0 < key_end; key0 += kPrefillKeyBlock) {
    const int keys = std::min(kPrefillKeyBlock, key_end - key0);
    const std::int64_t at =
        slot * view.slot_stride + static_cast<std::int64_t>(key0) * view.token_stride;
    const HeadRows k_rows{static_cast<const char*>(view.k) + at * bytes, view.token_stride,
                          kv_head * view.head_stride,
                          static_cast<std::int64_t>(view.layout.k_scale_offset), kv_head};
    const HeadRows v_rows{static_cast<const char*>(view.v) + at * bytes, view.token_stride,
                          kv_head * view.head_stride,
                          static_cast<std::int64_t>(view.layout.v_scale_offset), kv_head};
    int ldk = 0;
    const float* k = key_block(k_rows, keys, d, type_, s.k.data(), &ldk);
    blas::sgemm(true, rows, keys, d, scale_, s.q.data(), d, k, ldk, 0.0f, s.scores.data(),
                kPrefillKeyBlock);
    if (softcap_ > 0) {
      for (int i = 0; i < rows; ++i) {
        kernels::soft_cap(s.scores.data() + static_cast<std::int64_t>(i) * kPrefillKeyBlock, keys,
                          softcap_);
      }
    }
    kernels::softmax_block(s.scores.data(), rows, keys, kPrefillKeyBlock, key0, s.first.data(),
                           s.last.data(), s.state.data(), s.out.data(), d);
    int ldv = 0;
    const float* v = key_block(v_rows, keys, d, type_, s.v.data(), &ldv);
    blas::sgemm(false, rows, d, keys, 1.0f, s.scores.data(), kPrefillKeyBlock, v, ldv, 1.0f,
                s.out.data(), d);
  }
  for (int t = 0; t < tokens; ++t) {
    for (int r = 0; r < group_; ++r) {
      const int i = t * group_ + r;
      const float inv = 1.0f / s.state[static_cast<std::size_t>(i)].sum;
      const float* src = s.out.data() + static_cast<std::int64_t>(i) * d;
      float* dst = out + (static_cast<std::int64_t>(t0 + t) * heads + kv_head * group_ + r) * d;
      for (int e = 0; e < d; ++e) dst[e] = src[e] * inv;
    }
  }
}

void HostAttention::decode(const float* q, int n, const std::int32_t* slots,
                           const std::int32_t* positions, int window, const LayerView& view,
                           float* out) {
  decode(q, n, slots, positions, window, view, out, KeyRange{});
}

void HostAttention::decode(const float* q, int n, const std::int32_t* slots,
                           const std::int32_t* positions, int window, const LayerView& view,
                           float* out, const KeyRange& range) {
  decode_->run(q, n, slots, positions, window, view, out, range);
}

}  // namespace kvo::model
