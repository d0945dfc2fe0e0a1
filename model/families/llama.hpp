// The Llama block, which Mistral, Qwen2 and Qwen3 share (model/families/mistral.cpp, qwen2.cpp,
// qwen3.cpp, which adds a norm of each q and k head): an
// RMSNorm before attention and before the MLP, q, k and v projections (with biases where the
// config says), rotary embeddings, the output projection (with a bias where it says), and a
// SwiGLU MLP; and the tensors of its layers, as transformers names them.
#pragma once

#include <vector>

#include "model/families/family.hpp"

namespace kvo::model::llama {

std::vector<LayerTensor> layer_tensors(const ModelConfig& c);
// Its parts: the input norm and the attention's projections (with their biases), and the
// MLP's three matrices, appended to t.
std::vector<LayerTensor> attention_tensors(const ModelConfig& c);
void mlp_tensors(const ModelConfig& c, std::vector<LayerTensor>& t);
// a.q, a.k and a.v of x, before the rotation: the input norm and the projections; with wk and wv
// given, those in place of the layer's (parts of a fused tensor).
void project_qkv(const LayerContext& l, const float* x, int n);
void project_qkv(const LayerContext& l, const float* x, int n, WeightRef wk, WeightRef wv);
void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position);
void attention_output(const LayerContext& l, float* x, int n);
void mlp(const LayerContext& l, float* x, int n);
void mlp(const LayerContext& l, float* x, int n, WeightRef w_up);  // w_up in place of the layer's
// The MLP's branch of x [n][hidden] (its norm, gated projections and down projection) into y
// (y += with `accumulate`); y may be x, or a.xnorm (the norm's output is consumed first).
void mlp_branch(const LayerContext& l, const float* x, int n, WeightRef w_up, float* y,
                bool accumulate);

}  // namespace kvo::model::llama
