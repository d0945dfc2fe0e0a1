#include "offload/attend/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kvo::attend {

DecodeAttention::DecodeAttention(const DecodeShape& shape, ThreadPool& pool, DecodeScratch scratch)
    : shape_(shape),
      pool_(pool),
      group_(shape.heads / shape.kv_heads),
      avx512_(have_avx512() && shape.head_dim % 16 == 0),
      scratch_(std::move(scratch)) {}

std::string DecodeAttention::kernel() const {
  std::string name = avx512_ ? "avx512" : "portable (x86-64 level clones)";
  if (avx512_ && avx512_pairs(shape_.type, shape_.head_dim, group_)) {
    name += ", bf16 rows as even and odd halves";
  }
  if (in_place_quantized() && avx512_vnni_rows(shape_.type, shape_.head_dim, group_)) {
    name += ", int8 rows in place with VNNI (16-bit query and weights, exact integer sums)";
  } else if (in_place_quantized() && avx512_vbmi_rows(shape_.type)) {
    name += ", fp8 rows in place through byte tables with VBMI (exact)";
  } else if (in_place_quantized()) {
    name += std::string(", ") + dtype_name(shape_.type) +
            " rows in place (scales applied to scores and weights)";
  } else if (is_quantized(shape_.type)) {
    name += std::string(", over f32 blocks of ") + std::to_string(kDequantKeys) +
            " keys dequantized from " + dtype_name(shape_.type);
  }
  return name;
}

void DecodeAttention::run(const float* q, int n, const std::int32_t* slots,
                          const std::int32_t* positions, int window, const LayerView& view,
                          float* out, const KeyRange& range) {
  const int d = shape_.head_dim;
  const int heads = shape_.heads;
  const int kv_heads = shape_.kv_heads;
  const DType type = shape_.type;
  // Row i's keys: [lo, lo + count).
  const auto lo = [&](int i) {
    const int first = window > 0 ? std::max(0, positions[i] - window + 1) : 0;
    return range.begin != nullptr ? std::max(first, range.begin[slots[i]]) : first;
  };
  const auto count = [&](int i) {
    const int end =
        range.end != nullptr ? std::min(positions[i] + 1, range.end[slots[i]]) : positions[i] + 1;
    return std::max(0, end - lo(i));
  };
  int* first_task = scratch_.first_task;
  first_task[0] = 0;
  for (int i = 0; i < n; ++i) {
    const int keys = count(i);
    first_task[i + 1] = first_task[i] + (keys > 0 ? split(keys).parts : 0);
  }
  // Partials of (row i, part p): states [heads], values [heads][d].
  auto part_index = [&](int i, int p) { return static_cast<std::size_t>(i) * kMaxParts + p; };
  const std::size_t values_per_part = static_cast<std::size_t>(heads) * d;
  // 1. Each (row, part of the keys): a partial softmax over its keys for every kv head.
  const auto bytes = static_cast<std::int64_t>(element_bytes(type));
  pool_.run(first_task[n], [&](int task, int thread) {
    const int i =
        static_cast<int>(std::upper_bound(first_task, first_task + n + 1, task) - first_task - 1);
    const int first = lo(i);
    const int keys = count(i);
    const Split sp = split(keys);
    const int p = task - first_task[i];
    const int part0 = first + p * sp.part_keys;
    const DecodeScratch::Thread& s = scratch_.threads[static_cast<std::size_t>(thread)];
    const float* qi = q + static_cast<std::int64_t>(i) * heads * d;
    for (std::size_t e = 0; e < values_per_part; ++e) s.q[e] = qi[e] * shape_.scale;
    SoftmaxState* state = scratch_.part_state + part_index(i, p) * heads;
    float* values = scratch_.part_values + part_index(i, p) * values_per_part;
    std::fill(state, state + heads, SoftmaxState{});
    std::fill(values, values + values_per_part, 0.0f);
    const char* k_first = static_cast<const char*>(view.k) +
                          (slots[i] * view.slot_stride + part0 * view.token_stride) * bytes;
    const char* v_first = static_cast<const char*>(view.v) +
                          (slots[i] * view.v_slot_stride + part0 * view.v_token_stride) * bytes;
    const int part_keys = std::min(sp.part_keys, keys - p * sp.part_keys);
    const auto attend = avx512_ ? attend_keys_avx512 : attend_keys;
    if (!is_quantized(type) || in_place_quantized()) {  // the rows where they are
      const KeyRows k{k_first, view.token_stride, view.head_stride, type,
                      static_cast<std::int64_t>(view.layout.k_scale_offset)};
      const KeyRows v{v_first, view.v_token_stride, view.v_head_stride, type,
                      static_cast<std::int64_t>(view.layout.v_scale_offset)};
      attend(s.q, kv_heads, group_, d, k, v, part_keys, state, values, s.kv, s.scores,
             shape_.softcap);
      return;
    }
    // Quantized rows: blocks of keys dequantized, every head at once, then attended as f32.
    const std::int64_t row = static_cast<std::int64_t>(kv_heads) * d;
    const KeyRows k{s.k, row, d, DType::kF32};
    const KeyRows v{s.v, row, d, DType::kF32};
    for (int j0 = 0; j0 < part_keys; j0 += kDequantKeys) {
      const int block = std::min(kDequantKeys, part_keys - j0);
      for (int j = 0; j < block; ++j) {
        dequantize_row(k_first + (j0 + j) * view.token_stride, kv_heads, d, type, s.k + j * row);
        dequantize_row(v_first + (j0 + j) * view.v_token_stride, kv_heads, d, type, s.v + j * row);
      }
      attend(s.q, kv_heads, group_, d, k, v, block, state, values, s.kv, s.scores, shape_.softcap);
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
      const float* first_values = scratch_.part_values + part_index(i, 0) * values_per_part +
                                  static_cast<std::size_t>(h) * d;
      std::copy(first_values, first_values + d, dst);
      for (int p = 1; p < parts; ++p) {
        const MergeScales m =
            softmax_merge(state, scratch_.part_state[part_index(i, p) * heads + h]);
        const float* values = scratch_.part_values + part_index(i, p) * values_per_part +
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

}  // namespace kvo::attend
