// Decode attention on the host, reading a cache's K/V rows in place (f32, f16, bf16, and int8
// and fp8 where the CPU has AVX-512, through the view's strides; int8 and fp8 rows elsewhere
// dequantized block by block into f32 scratch), all query heads of a GQA group per K/V pass. The
// host path's decode (model/host/host_attention.hpp) and split attention's host part through the C
// ABI (kvo_host_attention_run) are this one code.
//
// Each row is split over parts of its keys, as a GPU split-K decode does: a task is (row, part),
// which walks its keys front to back, every kv head of a block of keys at once (the rows are
// token-major, so a task reads one contiguous range; a task per kv head would read a 1/kv_heads
// slice of every page, which measured 10x slower). Each leaves a partial softmax state and
// weighted sum per kv head, and a second pass, (row, kv head) per task, merges the parts in order.
// How the keys are split depends on the key count only, so the result is the same for any thread
// count, and a row's result does not depend on the other rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "kvoffload/quant.hpp"
#include "offload/attend/attend_keys.hpp"
#include "offload/attend/softmax.hpp"
#include "offload/attend/thread_pool.hpp"

namespace kvo::attend {

// What one layer's decode attends with: its query and kv heads, the rows' element type, and the
// scores' scale and soft cap (0: none). REQUIRES: heads a multiple of kv_heads.
struct DecodeShape {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  DType type = DType::kBF16;
  float scale = 1;
  float softcap = 0;
};

// The keys a decode row attends, cut for split attention: row i, of slot slots[i] at position
// positions[i], attends keys [max(first, begin[s]), min(positions[i] + 1, end[s])) of its slot s
// (0 and positions[i] + 1 where null: LayerView::split_rows serves as either), and writes its
// log-sum-exp per head to lse [n][heads] where not null: log2 of the sum of exp of its scaled,
// capped scores, as FlashInfer's, so that lse_merge joins the parts exactly. A row left with no
// keys gives out 0 and lse -inf, which lse_merge drops.
struct KeyRange {
  const std::int32_t* begin = nullptr;  // [slots], host
  const std::int32_t* end = nullptr;    // [slots], host
  float* lse = nullptr;                 // [n][heads]
};

// Where decode works: per pool thread, the scaled query and the kernels' scratch; per row, the
// parts' partial states and sums. DecodeAttention::sizes says how many of each.
struct DecodeScratch {
  struct Thread {
    float* q = nullptr;       // [heads][head_dim], scaled
    float* kv = nullptr;      // [kKeyBlock][kv_heads][head_dim]: the portable kernel's blocks;
                              // the AVX-512 kernel's query (paired bf16, or int16 with VNNI)
    float* scores = nullptr;  // [heads][kKeyBlock]
    float* k = nullptr;       // quantized rows: [kDequantKeys][kv_heads][head_dim] each
    float* v = nullptr;
  };
  std::vector<Thread> threads;         // [pool threads]
  SoftmaxState* part_state = nullptr;  // [rows][kMaxParts][heads]
  float* part_values = nullptr;        // [rows][kMaxParts][heads][head_dim]
  int* first_task = nullptr;           // [rows + 1]
};

class DecodeAttention {
 public:
  static constexpr int kMinPartKeys = 256;  // keys per part, at least...
  static constexpr int kMaxParts = 64;      // ...and at most this many parts per row
  static constexpr int kDequantKeys = 64;   // quantized rows: keys dequantized per block

  // Elements of each buffer of DecodeScratch for `shape` and at most `max_rows` rows a call.
  struct Sizes {
    std::size_t q = 0, kv = 0, scores = 0, dequant = 0;  // per thread (dequant: each of k and v)
    std::size_t part_states = 0, part_values = 0, first_task = 0;
  };
  static Sizes sizes(const DecodeShape& shape, int max_rows);

  // How `keys` keys are split: parts of part_keys keys (the last may be shorter).
  struct Split {
    int parts = 1;
    int part_keys = 0;
  };
  static Split split(int keys);

  // scratch: buffers of sizes(shape, max_rows) for each of pool.threads() threads. Both outlive
  // this object.
  DecodeAttention(const DecodeShape& shape, ThreadPool& pool, DecodeScratch scratch);

  // Row i: q [heads][head_dim] of slots[i] at positions[i] (host arrays), over keys
  // [first_key, positions[i]] of `view` (first_key: 0, or the last `window` of them where
  // window > 0), cut by `range`. out [n][heads][head_dim]. Scores are scaled and capped as the
  // shape says. REQUIRES: n <= max_rows; the view's V rows as wide as its K rows.
  void run(const float* q, int n, const std::int32_t* slots, const std::int32_t* positions,
           int window, const LayerView& view, float* out, const KeyRange& range);

  // Which kernel run() takes for this shape on this CPU, in words (benchmarks say it).
  std::string kernel() const;

 private:
  // int8 and fp8 rows read in place (the AVX-512 kernel); dequantized without it.
  bool in_place_quantized() const { return avx512_ && is_quantized(shape_.type); }

  DecodeShape shape_;
  ThreadPool& pool_;
  int group_;
  bool avx512_;  // through attend_keys_avx512
  DecodeScratch scratch_;
};

// Inline, for the memory plan's counts (model/host/host_workspace.cpp) wherever it is linked.
inline DecodeAttention::Sizes DecodeAttention::sizes(const DecodeShape& shape, int max_rows) {
  const auto d = static_cast<std::size_t>(shape.head_dim);
  const auto heads = static_cast<std::size_t>(shape.heads);
  const auto kv_heads = static_cast<std::size_t>(shape.kv_heads);
  Sizes s;
  s.q = heads * d;
  s.kv = static_cast<std::size_t>(kKeyBlock) * kv_heads * d;
  s.scores = heads * static_cast<std::size_t>(kKeyBlock);
  s.dequant = is_quantized(shape.type) ? static_cast<std::size_t>(kDequantKeys) * kv_heads * d : 0;
  s.part_states = static_cast<std::size_t>(max_rows) * kMaxParts * heads;
  s.part_values = s.part_states * d;
  s.first_task = static_cast<std::size_t>(max_rows) + 1;
  return s;
}

inline DecodeAttention::Split DecodeAttention::split(int keys) {
  Split s;
  const int parts = (keys + kMinPartKeys - 1) / kMinPartKeys;
  s.parts = parts < 1 ? 1 : parts > kMaxParts ? kMaxParts : parts;
  s.part_keys = (keys + s.parts - 1) / s.parts;
  s.parts = s.part_keys > 0 ? (keys + s.part_keys - 1) / s.part_keys : 1;
  if (s.parts < 1) s.parts = 1;
  return s;
}

}  // namespace kvo::attend
