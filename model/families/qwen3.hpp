// Qwen3's additions to the Llama block, which Gemma 3 shares (model/families/qwen3.cpp).
#pragma once

#include <vector>

#include "model/families/family.hpp"

namespace kvo::model::qwen3 {

// The layer's tensors with q_norm and k_norm ([head_dim] each) after the attention's
// projections, as the checkpoints list them.
std::vector<LayerTensor> with_head_norms(std::vector<LayerTensor> t, const ModelConfig& c);
std::vector<LayerTensor> layer_tensors(const ModelConfig& c);
// The projections, an RMSNorm over each q and k head, then the rotation.
void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position);

}  // namespace kvo::model::qwen3
