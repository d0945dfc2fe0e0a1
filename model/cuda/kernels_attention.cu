// Attention over the staged K/V prefix. Decode: each block takes one (query row, head, key
// range); threads score a tile of keys (one key each), the tile goes through an online softmax,
// and each thread accumulates its share of head_dim; with several key ranges per row (few rows,
// long prefixes) the partial states are merged after. Prefill: the kernels between the cuBLAS
// GEMMs of a key block (cuda_ops.cpp) -- K/V conversion, masked online softmax, normalisation.
// Grouped-query: head h reads kv head h / (heads / kv_heads). Kernels first, then launchers.
#include "model/cuda/cuda_check.hpp"
#include "model/cuda/kernels.hpp"

#include <string>

namespace kvo::model::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxDimsPerThread = 1024 / kThreads;  // head_dim <= 1024

__device__ float block_reduce(float value, float* shared, bool is_max) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = is_max ? fmaxf(value, other) : value + other;
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < kThreads / 32; ++w)
    total = is_max ? fmaxf(total, shared[w]) : total + shared[w];
  __syncthreads();
  return total;
}

// grid (n, heads, splits); dynamic shared memory: q [head_dim] + probabilities [kThreads].
__global__ void attention_kernel(AttentionArgs a, int splits, float* partials) {
  extern __shared__ float shared[];
  const LayerView& kv = a.kv;
  const int head_dim = kv.layout.head_dim;
  float* q = shared;             // [head_dim]
  float* p = shared + head_dim;  // [kThreads]
  __shared__ float reduce[kThreads / 32];
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int split = blockIdx.z;
  const int slot = a.slots[row];
  const int pos = a.positions[row];
  int first =
      a.sliding_window > 0 && pos - a.sliding_window + 1 > 0 ? pos - a.sliding_window + 1 : 0;
  if (a.first_keys != nullptr) first = max(first, a.first_keys[slot]);
  const int keys = pos - first + 1;
  const int per_split = (keys + splits - 1) / splits;
  const int begin = first + split * per_split;
  const int end = min(pos + 1, begin + per_split);  // exclusive
  const int kv_head = head / (a.heads / kv.layout.kv_heads);
  const float scale = a.scale;
  const DType type = kv.layout.dtype;
  const auto k_scales = static_cast<std::int64_t>(kv.layout.k_scale_offset);
  const auto v_scales = static_cast<std::int64_t>(kv.layout.v_scale_offset);

  const float* q_row = a.q + (static_cast<std::int64_t>(row) * a.heads + head) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += kThreads) q[e] = q_row[e];
  __syncthreads();

  // Rows of this slot, and this kv head's elements in them, in K and in V.
  const std::int64_t k_slot = slot * kv.slot_stride;
  const std::int64_t v_slot = slot * kv.v_slot_stride;
  const std::int64_t k_head = kv_head * kv.head_stride;
  const std::int64_t v_head = kv_head * kv.v_head_stride;
  // Quantized rows: a key's score and a value's weight take the row's scale for this kv head.
  const bool quantized = is_quantized(type);
  float acc[kMaxDimsPerThread];
  for (int i = 0; i < kMaxDimsPerThread; ++i) acc[i] = 0;
  SoftmaxState state;
  for (int tile = begin; tile < end; tile += kThreads) {
    const int j = tile + threadIdx.x;
    const std::int64_t k_row = k_slot + static_cast<std::int64_t>(j) * kv.token_stride;
    const std::int64_t v_row = v_slot + static_cast<std::int64_t>(j) * kv.v_token_stride;
    float score = -INFINITY;
    if (j < end) {
      float dot = 0;
      for (int e = 0; e < head_dim; ++e) dot += q[e] * load_elem(kv.k, k_row + k_head + e, type);
      if (quantized) dot *= kv_scale(kv.k, k_row, k_scales, kv_head);
      score = dot * scale;
      if (a.softcap > 0) score = soft_cap_value(score, a.softcap);
    }
    SoftmaxState tile_state;
    tile_state.max = block_reduce(score, reduce, true);
    const float prob = j < end ? expf(score - tile_state.max) : 0.0f;
    tile_state.sum = block_reduce(prob, reduce, false);
    p[threadIdx.x] = quantized && j < end ? prob * kv_scale(kv.v, v_row, v_scales, kv_head) : prob;
    __syncthreads();
    const MergeScales k = softmax_merge(state, tile_state);
    const int count = min(kThreads, end - tile);
    for (int i = 0; i * kThreads + static_cast<int>(threadIdx.x) < head_dim; ++i) {
      const int e = i * kThreads + threadIdx.x;
      float sum = 0;
      for (int t = 0; t < count; ++t) {
        const std::int64_t at =
            v_slot + static_cast<std::int64_t>(tile + t) * kv.v_token_stride + v_head + e;
        sum += p[t] * load_elem(kv.v, at, type);
      }
      acc[i] = acc[i] * k.a + sum * k.b;
    }
    __syncthreads();
  }

  if (splits == 1) {
    float* out = a.out + (static_cast<std::int64_t>(row) * a.heads + head) * head_dim;
    const float inv = state.sum > 0 ? 1.0f / state.sum : 0.0f;
    for (int i = 0; i * kThreads + static_cast<int>(threadIdx.x) < head_dim; ++i) {
      out[i * kThreads + threadIdx.x] = acc[i] * inv;
    }
    if (a.lse != nullptr && threadIdx.x == 0) {
      a.lse[static_cast<std::int64_t>(row) * a.heads + head] = softmax_lse2(state);
    }
    return;
  }
  // partials [row][head][split][head_dim + 2]: unnormalized values, then max and sum.
  float* part = partials + ((static_cast<std::int64_t>(row) * a.heads + head) * splits + split) *
                               (head_dim + 2);
  for (int i = 0; i * kThreads + static_cast<int>(threadIdx.x) < head_dim; ++i) {
    part[i * kThreads + threadIdx.x] = acc[i];
  }
  if (threadIdx.x == 0) {
    part[head_dim] = state.max;
    part[head_dim + 1] = state.sum;
  }
}

// grid (n, heads); threads over head_dim: merges the splits of one (row, head).
__global__ void merge_kernel(const float* partials, int heads, int head_dim, int splits, float* out,
                             float* lse) {
  const std::int64_t rh = static_cast<std::int64_t>(blockIdx.x) * heads + blockIdx.y;
  const float* part = partials + rh * splits * (head_dim + 2);
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    SoftmaxState state;
    float acc = 0;
    for (int s = 0; s < splits; ++s) {
      const float* ps = part + static_cast<std::int64_t>(s) * (head_dim + 2);
      SoftmaxState other;
      other.max = ps[head_dim];
      other.sum = ps[head_dim + 1];
      const MergeScales k = softmax_merge(state, other);
      acc = acc * k.a + ps[e] * k.b;
    }
    out[rh * head_dim + e] = state.sum > 0 ? acc / state.sum : 0.0f;
    if (lse != nullptr && e == 0) lse[rh] = softmax_lse2(state);
  }
}

// grid (keys, kv_heads); threads over head_dim.
__global__ void gather_kv_kernel(LayerView kv, int slot, int first_key, void* k_out, void* v_out,
                                 DType out_type) {
  const int key = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int head_dim = kv.layout.head_dim;
  const DType type = kv.layout.dtype;
  const std::int64_t token = first_key + key;
  const std::int64_t k_row = slot * kv.slot_stride + token * kv.token_stride;
  const std::int64_t v_row = slot * kv.v_slot_stride + token * kv.v_token_stride;
  const std::int64_t k_from = k_row + kv_head * kv.head_stride;
  const std::int64_t v_from = v_row + kv_head * kv.v_head_stride;
  const std::int64_t to = (static_cast<std::int64_t>(key) * gridDim.y + kv_head) * head_dim;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  if (is_quantized(type)) {
    k_scale = kv_scale(kv.k, k_row, static_cast<std::int64_t>(kv.layout.k_scale_offset), kv_head);
    v_scale = kv_scale(kv.v, v_row, static_cast<std::int64_t>(kv.layout.v_scale_offset), kv_head);
  }
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    store_elem(k_out, to + e, out_type, load_elem(kv.k, k_from + e, type) * k_scale);
    store_elem(v_out, to + e, out_type, load_elem(kv.v, v_from + e, type) * v_scale);
  }
}

// grid (n, heads): out [row][head] merged with a tile's output (lse_merge).
__global__ void merge_tile_kernel(const void* tile_out, DType tile_type, const float* tile_lse,
                                  int heads, int head_dim, bool first, float* out, float* lse) {
  const int at = blockIdx.x * heads + blockIdx.y;
  const LseMerge m = first ? LseMerge{0.0f, 1.0f, tile_lse[at]} : lse_merge(lse[at], tile_lse[at]);
  const std::int64_t base = static_cast<std::int64_t>(at) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    const float t = load_elem(tile_out, base + e, tile_type);
    out[base + e] = first ? t : m.keep * out[base + e] + m.take * t;
  }
  __syncthreads();  // every thread has read lse[at] before it changes
  if (threadIdx.x == 0) lse[at] = m.lse;
}

// grid (n, heads); one (row, head) per block: the masked online-softmax step of one key block.
__global__ void prefill_softmax_kernel(PrefillBlock b, float* scores, float* stats, float* out) {
  __shared__ float reduce[kThreads / 32];
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int pos = b.first_position + row;
  const int first =
      b.sliding_window > 0 && pos - b.sliding_window + 1 > 0 ? pos - b.sliding_window + 1 : 0;
  // Unmasked keys of this row in the block: [lo, hi) in block indices.
  const int lo = max(0, first - b.key_begin);
  const int hi = min(b.keys, pos + 1 - b.key_begin);
  float* s = scores + (static_cast<std::int64_t>(head) * b.n + row) * b.key_stride;
  float* max_of = stats + static_cast<std::int64_t>(head) * b.n + row;
  float* sum_of = max_of + static_cast<std::int64_t>(b.heads) * b.n;
  if (b.softcap > 0) {
    for (int j = lo + threadIdx.x; j < hi; j += kThreads) s[j] = soft_cap_value(s[j], b.softcap);
    __syncthreads();
  }

  float local = -INFINITY;
  for (int j = lo + threadIdx.x; j < hi; j += kThreads) local = fmaxf(local, s[j]);
  const float block_max = block_reduce(local, reduce, true);
  SoftmaxState state;
  if (!b.first_block) {
    state.max = *max_of;
    state.sum = *sum_of;
  }
  const float factor = softmax_block_rescale(state, block_max);
  float sum = 0;
  for (int j = threadIdx.x; j < b.keys; j += kThreads) {
    const float p = j >= lo && j < hi && state.max != -INFINITY ? expf(s[j] - state.max) : 0.0f;
    s[j] = p;
    sum += p;
  }
  sum = block_reduce(sum, reduce, false);
  float* o = out + (static_cast<std::int64_t>(row) * b.heads + head) * b.head_dim;
  for (int e = threadIdx.x; e < b.head_dim; e += kThreads)
    o[e] = factor == 0 ? 0.0f : o[e] * factor;
  if (threadIdx.x == 0) {
    *max_of = state.max;
    *sum_of = state.sum * factor + sum;
  }
}

// grid (n, heads); threads over head_dim.
__global__ void prefill_normalize_kernel(int n, int heads, int head_dim, const float* stats,
                                         float* out) {
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const float sum =
      stats[static_cast<std::int64_t>(heads) * n + static_cast<std::int64_t>(head) * n + row];
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  float* o = out + (static_cast<std::int64_t>(row) * heads + head) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) o[e] *= inv;
}

}  // namespace

void attention(const AttentionArgs& args, int splits, float* partials, cudaStream_t stream) {
  if (args.n == 0) return;
  const KvLayout& layout = args.kv.layout;
  if (layout.head_dim > 1024) {
    throw Error(ErrorCode::kInvalidArgument, "attention: head_dim above 1024 is not supported");
  }
  if (layout.v_head_dim != layout.head_dim) {
    throw Error(ErrorCode::kInvalidArgument, "attention: V rows narrower or wider than K rows (" +
                                                 std::to_string(layout.v_head_dim) + " vs " +
                                                 std::to_string(layout.head_dim) + ")");
  }
  const dim3 grid(static_cast<unsigned>(args.n), static_cast<unsigned>(args.heads),
                  static_cast<unsigned>(splits));
  const std::size_t shared = sizeof(float) * static_cast<std::size_t>(layout.head_dim + kThreads);
  attention_kernel<<<grid, kThreads, shared, stream>>>(args, splits, partials);
  KVO_MODEL_LAUNCH_CHECK();
  if (splits > 1) {
    merge_kernel<<<dim3(static_cast<unsigned>(args.n), static_cast<unsigned>(args.heads)), 128, 0,
                   stream>>>(partials, args.heads, layout.head_dim, splits, args.out, args.lse);
    KVO_MODEL_LAUNCH_CHECK();
  }
}

void gather_kv_block(const LayerView& view, int slot, int first_key, int keys, void* k_out,
                     void* v_out, DType out_type, cudaStream_t stream) {
  if (keys == 0) return;
  if (view.layout.v_head_dim != view.layout.head_dim) {
    throw Error(ErrorCode::kInvalidArgument, "gather_kv_block: V rows of another width than K's");
  }
  gather_kv_kernel<<<dim3(static_cast<unsigned>(keys), static_cast<unsigned>(view.layout.kv_heads)),
                     kThreads, 0, stream>>>(view, slot, first_key, k_out, v_out, out_type);
  KVO_MODEL_LAUNCH_CHECK();
}

void merge_attention_tile(const void* tile_out, DType tile_type, const float* tile_lse, int n,
                          int heads, int head_dim, bool first, float* out, float* lse,
                          cudaStream_t stream) {
  if (n == 0) return;
  merge_tile_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), kThreads, 0,
                      stream>>>(tile_out, tile_type, tile_lse, heads, head_dim, first, out, lse);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill_softmax_block(const PrefillBlock& block, float* scores, float* stats, float* out,
                           cudaStream_t stream) {
  if (block.n == 0) return;
  prefill_softmax_kernel<<<dim3(static_cast<unsigned>(block.n), static_cast<unsigned>(block.heads)),
                           kThreads, 0, stream>>>(block, scores, stats, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill_normalize(int n, int heads, int head_dim, const float* stats, float* out,
                       cudaStream_t stream) {
  if (n == 0) return;
  prefill_normalize_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), kThreads,
                             0, stream>>>(n, heads, head_dim, stats, out);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
