// Sampling on the device: one block per row of logits, by the rule of sample_token
// (model/decoder/sampler.hpp), so that only the token ids travel back to the host. Top-k and top-p
// are thresholds on order_key(scaled logit), each found by bisecting the 32-bit key space (32
// passes over the row, no sort); the draw then scans the kept probabilities in id order.
// Kernels first, then the launcher.
#include <climits>

#include "model/cuda/cuda_check.hpp"
#include "model/cuda/kernels.hpp"

namespace kvo::model::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};

// The reduction of `value` over the block, returned to every thread. shared [kWarps].
template <typename T, typename Op>
__device__ T block_reduce(T value, T* shared, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < kWarps; ++w) total = op(total, shared[w]);
  __syncthreads();
  return total;
}

// Inclusive prefix sum over the block in thread order; *total gets the block's sum.
__device__ float block_inclusive_scan(float value, float* shared, float* total) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const float other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  if (lane == 31) shared[warp] = value;
  __syncthreads();
  float before = 0;
  float all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += shared[w];
    all += shared[w];
  }
  __syncthreads();
  *total = all;
  return before + value;
}

struct SampleRow {
  const float* logits;  // [vocab]
  int vocab;
  float temperature;
  float top;  // max scaled logit
};

__device__ float scaled(const SampleRow& r, int i) {
  return r.logits[i] / r.temperature;
}

// Candidates with order_key(scaled) >= cut.
__device__ unsigned count_at_least(const SampleRow& r, std::uint32_t cut, unsigned* shared) {
  unsigned count = 0;
  for (int i = threadIdx.x; i < r.vocab; i += kThreads) count += order_key(scaled(r, i)) >= cut;
  return block_reduce(count, shared, Sum());
}

// Sum of exp(scaled - top) over candidates with order_key(scaled) >= cut.
__device__ float mass_at_least(const SampleRow& r, std::uint32_t cut, float* shared) {
  float mass = 0;
  for (int i = threadIdx.x; i < r.vocab; i += kThreads) {
    const float x = scaled(r, i);
    if (order_key(x) >= cut) mass += expf(x - r.top);
  }
  return block_reduce(mass, shared, Sum());
}

// grid (n); kThreads threads. rows [2][n]: slot, draw.
__global__ void sample_kernel(const float* logits, int n, int vocab, float temperature, int top_k,
                              float top_p, std::uint64_t seed, const std::int32_t* rows,
                              std::int32_t* tokens) {
  __shared__ float fshared[kWarps];
  __shared__ unsigned ushared[kWarps];
  __shared__ int ishared[kWarps];
  const int row = blockIdx.x;
  const float* l = logits + static_cast<std::int64_t>(row) * vocab;

  if (temperature == 0) {  // argmax, lowest id on ties
    float best = -INFINITY;
    int id = INT_MAX;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      if (id == INT_MAX || l[i] > best) {
        best = l[i];
        id = i;
      }
    }
    const float top = block_reduce(id == INT_MAX ? -INFINITY : best, fshared, Max());
    const int first = block_reduce(id != INT_MAX && best == top ? id : INT_MAX, ishared, Min());
    if (threadIdx.x == 0) tokens[row] = first == INT_MAX ? 0 : first;
    return;
  }

  SampleRow r{l, vocab, temperature, -INFINITY};
  float local = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) local = fmaxf(local, scaled(r, i));
  r.top = block_reduce(local, fshared, Max());

  // Bisection invariants: the condition holds at lo and fails at hi (2^32: past every key).
  std::uint32_t cut = 0;
  if (top_k > 0 && top_k < vocab) {
    std::uint64_t lo = 0, hi = 1ull << 32;
    while (hi - lo > 1) {
      const std::uint64_t mid = (lo + hi) / 2;
      if (count_at_least(r, static_cast<std::uint32_t>(mid), ushared) >=
          static_cast<unsigned>(top_k)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    cut = static_cast<std::uint32_t>(lo);
  }
  float total = mass_at_least(r, cut, fshared);
  if (top_p < 1) {
    const float goal = top_p * total;
    std::uint64_t lo = cut, hi = 1ull << 32;
    while (hi - lo > 1) {
      const std::uint64_t mid = (lo + hi) / 2;
      if (mass_at_least(r, static_cast<std::uint32_t>(mid), fshared) >= goal) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    cut = static_cast<std::uint32_t>(lo);
    total = mass_at_least(r, cut, fshared);
  }

  const float target =
      sampling_uniform(seed, static_cast<std::uint64_t>(rows[row]),
                       static_cast<std::uint64_t>(static_cast<std::uint32_t>(rows[n + row]))) *
      total;
  float running = 0;
  int last = 0;
  int token = INT_MAX;
  for (int base = 0; base < vocab && token == INT_MAX; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    float p = 0;
    if (i < vocab) {
      const float x = scaled(r, i);
      if (order_key(x) >= cut) p = expf(x - r.top);
    }
    float chunk = 0;
    const float inclusive = block_inclusive_scan(p, fshared, &chunk);
    const bool hit = p > 0 && running + inclusive > target;
    token = block_reduce(hit ? i : INT_MAX, ishared, Min());
    last = max(last, block_reduce(p > 0 ? i : -1, ishared, Max()));
    running += chunk;
  }
  if (threadIdx.x == 0) tokens[row] = token == INT_MAX ? last : token;
}

}  // namespace

void sample(const float* logits, int n, int vocab, float temperature, int top_k, float top_p,
            std::uint64_t seed, const std::int32_t* rows, std::int32_t* tokens,
            cudaStream_t stream) {
  if (n == 0) return;
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      logits, n, vocab, temperature, top_k, top_p, seed, rows, tokens);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
