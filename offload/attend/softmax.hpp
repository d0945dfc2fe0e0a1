// The online softmax's arithmetic, shared by every attention of the project (the host's decode
// and prefill, split attention's merge, the CUDA kernels): soft-capping, a running softmax state,
// merging two states or two normalized outputs by their log-sum-exp. __host__ __device__ where
// CUDA compiles it, so the CPU tests cover what the kernels compute.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define KVO_ATTEND_HD __host__ __device__ __forceinline__
#else
#define KVO_ATTEND_HD inline
#endif

namespace kvo::attend {

// Soft-capping (Gemma 2's scores and logits): cap * tanh(x / cap).
KVO_ATTEND_HD float soft_cap_value(float x, float cap) {
  return tanhf(x / cap) * cap;
}

// ---- online softmax ---------------------------------------------------------------------------

// The state of a softmax-weighted sum over a range of keys: max score, sum of exp(score - max);
// the weighted values are kept by the caller, scaled by the same exp(score - max).
struct SoftmaxState {
  float max = -INFINITY;
  float sum = 0;
};

// Merging two partial states: returns the factors by which each side's accumulated values
// must be multiplied; `a` becomes the merged state.
struct MergeScales {
  float a = 1;
  float b = 1;
};

KVO_ATTEND_HD MergeScales softmax_merge(SoftmaxState& a, SoftmaxState b) {
  MergeScales scales;
  if (b.max == -INFINITY) {
    scales.b = 0;
    return scales;
  }
  if (a.max == -INFINITY) {
    scales.a = 0;
    a = b;
    return scales;
  }
  const float m = a.max > b.max ? a.max : b.max;
  scales.a = expf(a.max - m);
  scales.b = expf(b.max - m);
  a.sum = a.sum * scales.a + b.sum * scales.b;
  a.max = m;
  return scales;
}

// A softmax state's log-sum-exp in FlashInfer's convention (log2): (max + ln sum) log2 e; -inf
// for a state that has seen no keys.
KVO_ATTEND_HD float softmax_lse2(SoftmaxState s) {
  return s.sum > 0 ? (s.max + logf(s.sum)) * 1.4426950408889634f : -INFINITY;
}

// Merging a running attention output with the output of another, disjoint, range of keys, both
// normalized and each with its log-sum-exp in FlashInfer's convention (log2 of the sum of
// 2^(score * sm_scale * log2 e)): out = keep * out + take * tile, lse = log2(2^lse + 2^tile_lse).
// -inf is "no keys": a state that has seen none takes the tile whole. Exact up to rounding, in
// any order of the tiles.
struct LseMerge {
  float keep = 0;
  float take = 1;
  float lse = -INFINITY;
};

KVO_ATTEND_HD LseMerge lse_merge(float lse, float tile_lse) {
  if (lse == -INFINITY) return {0.0f, 1.0f, tile_lse};
  if (tile_lse == -INFINITY) return {1.0f, 0.0f, lse};
  const float m = lse > tile_lse ? lse : tile_lse;
  const float a = exp2f(lse - m);
  const float b = exp2f(tile_lse - m);
  const float sum = a + b;
  return {a / sum, b / sum, m + log2f(sum)};
}

// One key block of an online softmax for one query row, as the blocked prefill attention runs
// it: `block_max` is the largest unmasked score of the block (-inf when all are masked). Raises
// state.max to it and returns the factor by which the running sum and the accumulated values
// must be scaled before the block's exp(score - state.max) are added. 0 means "nothing seen
// yet": the caller starts its accumulator from zero instead of scaling it.
KVO_ATTEND_HD float softmax_block_rescale(SoftmaxState& state, float block_max) {
  if (block_max == -INFINITY || block_max <= state.max) return state.max == -INFINITY ? 0.0f : 1.0f;
  const float factor = state.max == -INFINITY ? 0.0f : expf(state.max - block_max);
  state.max = block_max;
  return factor;
}

}  // namespace kvo::attend
