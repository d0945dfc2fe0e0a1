// FlashInfer prefill attention without a mask over bf16 K/V, head_dim 64, 128 and 256
// (model/cuda/flashinfer_attention.cuh): the tiles of a quantized cache before the queries' own
// keys.
#include "model/cuda/flashinfer_attention.cuh"

namespace kvo::model::flashinfer_ops {
KVO_FLASHINFER_PREFILL_UNMASKED(DType::kBF16)
}  // namespace kvo::model::flashinfer_ops
