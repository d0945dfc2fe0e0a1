// Synthetic weights drawn on the device: the same pure function of (seed, stream, index) as the
// host's fill_synthetic, so a Llama-3-8B-shaped run needs no file and no host copy.
#include "model/cuda/cuda_check.hpp"
#include "model/cuda/kernels.hpp"

namespace kvo::model::cuda {
namespace {

__global__ void fill_synthetic_kernel(void* out, std::int64_t count, DType type, std::uint64_t seed,
                                      std::uint64_t stream_id, float scale, bool norm) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float u = seeded_uniform(seed, stream_id, static_cast<std::uint64_t>(i));
    store_elem(out, i, type, norm ? 1.0f + scale * u : scale * u);
  }
}

}  // namespace

void fill_synthetic(void* out, std::int64_t count, DType type, std::uint64_t seed,
                    std::uint64_t stream_id, float scale, bool norm, cudaStream_t stream) {
  if (count == 0) return;
  const std::int64_t blocks = (count + 255) / 256;
  fill_synthetic_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(
      out, count, type, seed, stream_id, scale, norm);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
