// Llama (2, 3, 3.1: LlamaForCausalLM), and the block its relatives share (llama.hpp).
#include "model/families/llama.hpp"

#include "model/decoder/memory_plan.hpp"

namespace kvo::model {
namespace llama {

std::vector<LayerTensor> attention_tensors(const ModelConfig& c) {
  using K = WeightKind;
  using W = LayerWeights;
  const std::int64_t h = c.hidden_size;
  std::vector<LayerTensor> t = {{"input_layernorm.weight", {h}, K::kNorm, &W::attn_norm},
                                {"self_attn.q_proj.weight", {c.q_dim(), h}, K::kMatrix, &W::wq},
                                {"self_attn.k_proj.weight", {c.kv_dim(), h}, K::kMatrix, &W::wk},
                                {"self_attn.v_proj.weight", {c.kv_dim(), h}, K::kMatrix, &W::wv},
                                {"self_attn.o_proj.weight", {h, c.q_dim()}, K::kMatrix, &W::wo}};
  if (c.qkv_bias) {
    t.push_back({"self_attn.q_proj.bias", {c.q_dim()}, K::kBias, &W::bq});
    t.push_back({"self_attn.k_proj.bias", {c.kv_dim()}, K::kBias, &W::bk});
    t.push_back({"self_attn.v_proj.bias", {c.kv_dim()}, K::kBias, &W::bv});
  }
  if (c.o_bias) t.push_back({"self_attn.o_proj.bias", {h}, K::kBias, &W::bo});
  return t;
}

void mlp_tensors(const ModelConfig& c, std::vector<LayerTensor>& t) {
  using K = WeightKind;
  using W = LayerWeights;
  const std::int64_t h = c.hidden_size;
  const std::int64_t ff = c.intermediate_size;
  t.push_back({"mlp.gate_proj.weight", {ff, h}, K::kMatrix, &W::w_gate});
  t.push_back({"mlp.up_proj.weight", {ff, h}, K::kMatrix, &W::w_up});
  t.push_back({"mlp.down_proj.weight", {h, ff}, K::kMatrix, &W::w_down});
}

std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  std::vector<LayerTensor> t = attention_tensors(c);
  t.push_back({"post_attention_layernorm.weight",
               {c.hidden_size},
               WeightKind::kNorm,
               &LayerWeights::mlp_norm});
  mlp_tensors(c, t);
  return t;
}

void project_qkv(const LayerContext& l, const float* x, int n, WeightRef wk, WeightRef wv) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  const int qd = static_cast<int>(c.q_dim());
  const int kvd = static_cast<int>(c.kv_dim());
  l.ops.rms_norm(x, n, c.hidden_size, l.w.attn_norm, a.xnorm);
  const Ops::Projection qkv[3] = {{l.w.wq, l.w.bq, qd, a.q, false},
                                  {wk, l.w.bk, kvd, a.k, false},
                                  {wv, l.w.bv, kvd, a.v, false}};
  l.ops.linear_many(a.xnorm, n, c.hidden_size, qkv, 3);
}

void project_qkv(const LayerContext& l, const float* x, int n) {
  project_qkv(l, x, n, l.w.wk, l.w.wv);
}

void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position) {
  project_qkv(l, x, n);
  l.ops.rope(l.a.q, l.a.k, n, positions, first_position, l.local_rope);
}

void attention_output(const LayerContext& l, float* x, int n) {
  const ModelConfig& c = l.config;
  l.ops.linear(l.a.attn, n, static_cast<int>(c.q_dim()), l.w.wo, l.w.bo, c.hidden_size, x, true);
}

void mlp(const LayerContext& l, float* x, int n) {
  mlp(l, x, n, l.w.w_up);
}

void mlp(const LayerContext& l, float* x, int n, WeightRef w_up) {
  mlp_branch(l, x, n, w_up, x, true);
}

void mlp_branch(const LayerContext& l, const float* x, int n, WeightRef w_up, float* y,
                bool accumulate) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  const int h = c.hidden_size;
  const int ff = c.intermediate_size;
  l.ops.rms_norm(x, n, h, l.w.mlp_norm, a.xnorm);
  const Ops::Projection gate_up[2] = {{l.w.w_gate, nullptr, ff, a.gate, false},
                                      {w_up, nullptr, ff, a.up, false}};
  l.ops.linear_many(a.xnorm, n, h, gate_up, 2);
  l.ops.gated_activation(a.gate, a.up, static_cast<std::int64_t>(n) * ff);
  l.ops.linear(a.gate, n, ff, l.w.w_down, nullptr, h, y, accumulate);
}

}  // namespace llama

// Llama's config: attention_bias puts biases on q, k, v and the output projection alike.
extern const Family kLlamaFamily;
const Family kLlamaFamily = {
    "llama",
    {"LlamaForCausalLM"},
    [](ModelConfig&) {},
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) { o["attention_bias"] = c.qkv_bias; },
    llama::layer_tensors,
    llama::attention_inputs,
    llama::attention_output,
    llama::mlp};

}  // namespace kvo::model
