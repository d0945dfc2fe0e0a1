// Matrices kept in GGUF blocks (model/checkpoint/ggml_blocks.hpp) on the device: a decode step's
// rows multiply them with a kernel that reads every block once (one warp per output row walking
// it a part of 32 weights at a time, lane l dequantizing element l in registers by the header's
// own arithmetic, so the weights are the host path's to the bit and the loads coalesce); a prefill
// chunk multiplies a tile of their rows dequantized into the model dtype with cuBLAS
// (cuda_ops.cpp); the embedding reads its rows the same way. Kernels first, then launchers.
#include <string>
#include <type_traits>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/cuda/cuda_check.hpp"
#include "model/cuda/kernels.hpp"

namespace kvo::model::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 256;

// Parts of 32 elements in a block of kType.
template <std::uint32_t kType>
__device__ __forceinline__ int parts_per_block() {
  return blocks::block_elements(kType) / 32;
}

// Element e of a row of kType blocks at `row`: lane-sized (part_element_of).
template <std::uint32_t kType>
__device__ __forceinline__ float row_element(const std::uint8_t* row, int e) {
  const int per = parts_per_block<kType>();
  const int p = e / 32;
  return blocks::part_element(kType,
                              row + static_cast<std::int64_t>(p / per) * blocks::block_bytes(kType),
                              p % per, e % 32);
}

// y [t][o] (+)= row o of W . x [t], t < n <= kBlockDecodeRows (kMaxRows): warp w of block b takes
// output o = b * kWarpsPerBlock + w and walks its row a part of 32 weights at a time, lane l
// taking element l of each part, so that the warp loads x's 32 floats as one 128-byte run and
// the part's quants as one run of bytes (coalesced); each lane sums its elements, the warp its
// lanes.
template <std::uint32_t kType, int kMaxRows>
__global__ void linear_blocks_kernel(const float* __restrict__ x, int n, int in,
                                     const std::uint8_t* __restrict__ w, int out,
                                     float* __restrict__ y, bool accumulate) {
  const int o = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= out) return;
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(in / blocks::block_elements(kType)) * blocks::block_bytes(kType);
  const std::uint8_t* row = w + o * row_bytes;
  float acc[kMaxRows];
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (int e = lane; e < in; e += 32) {
    const float we = row_element<kType>(row, e);
#pragma unroll
    for (int t = 0; t < kMaxRows; ++t) {
      if (t >= n) break;
      acc[t] = fmaf(we, x[static_cast<std::int64_t>(t) * in + e], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t) {
    if (t >= n) break;
    float v = acc[t];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) {
      float& dst = y[static_cast<std::int64_t>(t) * out + o];
      dst = accumulate ? dst + v : v;
    }
  }
}

// out [rows][in] (type) = the rows, one thread per element: consecutive threads read consecutive
// quants and write consecutive elements (coalesced both ways).
template <std::uint32_t kType>
__global__ void dequantize_kernel(const std::uint8_t* __restrict__ w, std::int64_t rows, int in,
                                  void* __restrict__ out, DType type) {
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(in / blocks::block_elements(kType)) * blocks::block_bytes(kType);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < rows * in; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / in;
    store_elem(out, i, type, row_element<kType>(w + r * row_bytes, static_cast<int>(i - r * in)));
  }
}

// out [n][hidden] f32 = rows tokens[n] of the table: block (row), threads over its elements.
template <std::uint32_t kType>
__global__ void embed_kernel(const std::int32_t* __restrict__ tokens,
                             const std::uint8_t* __restrict__ table, int hidden,
                             float* __restrict__ out) {
  const int row = blockIdx.x;
  const std::int64_t row_bytes = static_cast<std::int64_t>(hidden / blocks::block_elements(kType)) *
                                 blocks::block_bytes(kType);
  const std::uint8_t* src = table + static_cast<std::int64_t>(tokens[row]) * row_bytes;
  float* o = out + static_cast<std::int64_t>(row) * hidden;
  for (int e = threadIdx.x; e < hidden; e += blockDim.x) o[e] = row_element<kType>(src, e);
}

// Calls f with the block type as a compile-time constant (the types dequantize_part serves).
template <typename F>
void with_type(std::uint32_t type, const char* what, F&& f) {
  visit_blocks(
      type, [&](auto t) { f(std::integral_constant<std::uint32_t, blocks::kGgml<decltype(t)>>()); },
      [&] {
        throw Error(ErrorCode::kInternal,
                    std::string(what) + ": GGUF type " + std::to_string(type) + " has no kernel");
      });
}

int grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

void linear_blocks(const float* x, int n, int in, const void* w, std::uint32_t type, int out,
                   float* y, bool accumulate, cudaStream_t stream) {
  if (n == 0 || out == 0) return;
  if (n > kBlockDecodeRowsMax) {
    throw Error(ErrorCode::kInternal, "linear_blocks: " + std::to_string(n) + " rows, more than " +
                                          std::to_string(kBlockDecodeRowsMax));
  }
  const int grid = (out + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const auto* bytes = static_cast<const std::uint8_t*>(w);
  with_type(type, "linear_blocks", [&](auto kind) {
    constexpr std::uint32_t kType = decltype(kind)::value;
    if (n == 1) {
      linear_blocks_kernel<kType, 1>
          <<<grid, kThreads, 0, stream>>>(x, n, in, bytes, out, y, accumulate);
    } else {
      linear_blocks_kernel<kType, kBlockDecodeRowsMax>
          <<<grid, kThreads, 0, stream>>>(x, n, in, bytes, out, y, accumulate);
    }
  });
  KVO_MODEL_LAUNCH_CHECK();
}

void dequantize_blocks(const void* w, std::uint32_t type, std::int64_t rows, int in, void* out,
                       DType out_type, cudaStream_t stream) {
  if (rows == 0) return;
  const auto* bytes = static_cast<const std::uint8_t*>(w);
  with_type(type, "dequantize_blocks", [&](auto kind) {
    constexpr std::uint32_t kType = decltype(kind)::value;
    dequantize_kernel<kType>
        <<<grid_for(rows * in), kThreads, 0, stream>>>(bytes, rows, in, out, out_type);
  });
  KVO_MODEL_LAUNCH_CHECK();
}

void embed_blocks(const std::int32_t* tokens, int n, const void* table, std::uint32_t type,
                  int hidden, float* out, cudaStream_t stream) {
  if (n == 0) return;
  const auto* bytes = static_cast<const std::uint8_t*>(table);
  with_type(type, "embed_blocks", [&](auto kind) {
    constexpr std::uint32_t kType = decltype(kind)::value;
    embed_kernel<kType><<<n, 128, 0, stream>>>(tokens, bytes, hidden, out);
  });
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
