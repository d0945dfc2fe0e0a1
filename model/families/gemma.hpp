// The Gemma block, which Gemma 2 and Gemma 3 share (model/families/gemma2.cpp, gemma3.cpp).
#pragma once

#include <vector>

#include "model/families/family.hpp"

namespace kvo::model::gemma {

std::vector<LayerTensor> layer_tensors(const ModelConfig& c);
// x += post_norm(o_proj(a.attn)).
void attention_output(const LayerContext& l, float* x, int n);
// x += post_norm(down(gelu_tanh(gate(pre_norm(x))) * up(pre_norm(x)))).
void mlp(const LayerContext& l, float* x, int n);
// What every Gemma has: (1 + w) norms, scaled embeddings, post norms, GeLU-tanh; a window of
// `window` keys where c has none, on every layer but each `pattern`-th (for c.layers).
void settle(ModelConfig& c, int window, int pattern);
// c.sliding_layers for c.layers: every `pattern`-th layer full, the others windowed.
void sliding_pattern(ModelConfig& c, int pattern);
// The fields both read, with each class's defaults: the soft-caps (0: none), the window, the
// length, and every `pattern`-th layer full where config.json lists no layer_types.
void read_config(const JsonField& f, ModelConfig& c, double attn_softcap, double final_softcap,
                 int window, int max_position, int pattern);
void write_config(const ModelConfig& c, nlohmann::ordered_json& o);
// The embeddings times sqrt(hidden_size), rounded to the weights' dtype as transformers' normalizer
// is.
float embedding_scale(const ModelConfig& c, DType weights);
// query_pre_attn_scalar^-1/2 (head_dim^-1/2 where it is 0).
double attention_scale(const ModelConfig& c);
// The logits soft-capped by final_logit_softcapping, where the config has one.
void logits(Ops& ops, const ModelConfig& c, float* logits, std::int64_t count);

}  // namespace kvo::model::gemma
