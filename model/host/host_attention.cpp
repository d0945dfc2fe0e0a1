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
      avx512_(kernels::have_avx512() && config.head_dim % 16 == 0),
      scratch_(std::move(scratch)) {}

HostAttention::HostAttention(const ModelConfig& config, DType type, int max_decode_rows,
                             ThreadPool& pool)
    : HostAttention(config, type, pool, HostAttentionScratch{}) {
  scratch_ = carve_own(&own_, [&](HostCarver& carver) {
    return HostAttentionScratch::carve(carver, config, type, max_decode_rows, pool.threads());
  });
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

HostAttention::Split HostAttention::split(int keys) {
  Split s;
  s.parts = std::clamp((keys + kMinPartKeys - 1) / kMinPartKeys, 1, kMaxParts);
  s.part_keys = (keys + s.parts - 1) / s.parts;
  s.parts = std::max(1, (keys + s.part_keys - 1) / s.part_keys);
  return s;
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
  const int d = config_.head_dim;
  const int heads = config_.heads;
  const int kv_heads = config_.kv_heads;
  // Row i's keys: [lo, lo + count).
  const auto lo = [&](int i) {
    const int first = first_key(window, positions[i]);
    return range.begin != nullptr ? std::max(first, range.begin[slots[i]]) : first;
  };
  const auto count = [&](int i) {
    const int end =
        range.end != nullptr ? std::min(positions[i] + 1, range.end[slots[i]]) : positions[i] + 1;
    return std::max(0, end - lo(i));
  };
  scratch_.first_task[0] = 0;
  for (int i = 0; i < n; ++i) {
    const int keys = count(i);
    scratch_.first_task[static_cast<std::size_t>(i) + 1] =
        scratch_.first_task[static_cast<std::size_t>(i)] + (keys > 0 ? split(keys).parts : 0);
  }
  // Partials of (row i, part p): states [heads], values [heads][d].
  auto part_index = [&](int i, int p) { return static_cast<std::size_t>(i) * kMaxParts + p; };
  const std::size_t values_per_part = static_cast<std::size_t>(heads) * d;
  // 1. Each (row, part of the keys): a partial softmax over its keys for every kv head.
  const std::int64_t bytes = elem_bytes(type_);
  pool_.run(scratch_.first_task[static_cast<std::size_t>(n)], [&](int task, int thread) {
    const int i = static_cast<int>(
        std::upper_bound(scratch_.first_task.begin(), scratch_.first_task.begin() + n + 1, task) -
        scratch_.first_task.begin() - 1);
    const int first = lo(i);
    const int keys = count(i);
    const Split sp = split(keys);
    const int p = task - scratch_.first_task[static_cast<std::size_t>(i)];
    const int part0 = first + p * sp.part_keys;
    DecodeScratch& s = scratch_.decode[static_cast<std::size_t>(thread)];
    const float* qi = q + static_cast<std::int64_t>(i) * heads * d;
    for (std::size_t e = 0; e < values_per_part; ++e) s.q[e] = qi[e] * scale_;
    SoftmaxState* state = scratch_.part_state.data() + part_index(i, p) * heads;
    float* values = scratch_.part_values.data() + part_index(i, p) * values_per_part;
    std::fill(state, state + heads, SoftmaxState{});
    std::fill(values, values + values_per_part, 0.0f);
    const std::int64_t at =
        slots[i] * view.slot_stride + static_cast<std::int64_t>(part0) * view.token_stride;
    const char* k_first = static_cast<const char*>(view.k) + at * bytes;
    const char* v_first = static_cast<const char*>(view.v) + at * bytes;
    const int part_keys = std::min(sp.part_keys, keys - p * sp.part_keys);
    const auto attend = avx512_ ? kernels::attend_keys_avx512 : kernels::attend_keys;
    if (!is_quantized(type_)) {
      const kernels::KeyRows k{k_first, view.token_stride, view.head_stride, type_};
      const kernels::KeyRows v{v_first, view.token_stride, view.head_stride, type_};
      attend(s.q.data(), kv_heads, group_, d, k, v, part_keys, state, values, s.kv.data(),
             s.scores.data(), softcap_);
      return;
    }
    // Quantized rows: blocks of keys dequantized, every head at once, then attended as f32.
    const DType dtype = type_;
    const std::int64_t row = static_cast<std::int64_t>(kv_heads) * d;
    const kernels::KeyRows k{s.k.data(), row, d, DType::kF32};
    const kernels::KeyRows v{s.v.data(), row, d, DType::kF32};
    for (int j0 = 0; j0 < part_keys; j0 += kDequantKeys) {
      const int block = std::min(kDequantKeys, part_keys - j0);
      for (int j = 0; j < block; ++j) {
        const std::int64_t from = (j0 + j) * view.token_stride;
        dequantize_row(k_first + from, kv_heads, d, dtype, s.k.data() + j * row);
        dequantize_row(v_first + from, kv_heads, d, dtype, s.v.data() + j * row);
      }
      attend(s.q.data(), kv_heads, group_, d, k, v, block, state, values, s.kv.data(),
             s.scores.data(), softcap_);
    }
  });
  // 2. Each (row, kv head): merge its parts in order, normalize.
  pool_.run(n * kv_heads, [&](int task, int) {
    const int i = task / kv_heads;
    const int g = task % kv_heads;
    const int keys = count(i);
    const int parts = keys > 0 ? split(keys).parts : 0;
    for (int h = g * group_; h < (g + 1) * group_; ++h) {
      float* dst = out + (static_cast<std::int64_t>(i) * heads + h) * d;
      float* lse =
          range.lse != nullptr ? range.lse + static_cast<std::int64_t>(i) * heads + h : nullptr;
      if (parts == 0) {
        std::fill(dst, dst + d, 0.0f);
        if (lse != nullptr) *lse = -INFINITY;
        continue;
      }
      SoftmaxState state = scratch_.part_state[part_index(i, 0) * heads + h];
      const float* first_values = scratch_.part_values.data() + part_index(i, 0) * values_per_part +
                                  static_cast<std::size_t>(h) * d;
      std::copy(first_values, first_values + d, dst);
      for (int p = 1; p < parts; ++p) {
        const MergeScales m =
            softmax_merge(state, scratch_.part_state[part_index(i, p) * heads + h]);
        const float* values = scratch_.part_values.data() + part_index(i, p) * values_per_part +
                              static_cast<std::size_t>(h) * d;
        for (int e = 0; e < d; ++e) dst[e] = dst[e] * m.a + values[e] * m.b;
      }
      const float inv = 1.0f / state.sum;
      for (int e = 0; e < d; ++e) dst[e] *= inv;
      // The scores were scaled (and capped) before the softmax: max + ln(sum), in log2.
      if (lse != nullptr) *lse = softmax_lse2(state);
    }
  });
}

}  // namespace kvo::model
