// FlashInfer decode attention over bf16 K/V, head_dim 64, 128 and 256
// (model/cuda/flashinfer_attention.cuh).
#include "model/cuda/flashinfer_attention.cuh"

namespace kvo::model::flashinfer_ops {
KVO_FLASHINFER_DECODE(DType::kBF16)
}  // namespace kvo::model::flashinfer_ops
