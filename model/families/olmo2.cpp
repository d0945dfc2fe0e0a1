// OLMo 2 (Olmo2ForCausalLM): no norm before the attention or the MLP; instead each branch is
// normed after it, before it joins the residual (post_attention_layernorm,
// post_feedforward_layernorm), and the query and key projections are each normed over their
// whole width (q_norm [heads * head_dim], k_norm [kv_heads * head_dim]) before the rotation. A
// SwiGLU MLP; biases on the attention's projections where attention_bias says.
#include "model/decoder/memory_plan.hpp"
#include "model/families/family.hpp"

namespace kvo::model {
namespace olmo2 {
namespace {

std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  using K = WeightKind;
  using W = LayerWeights;
  const std::int64_t h = c.hidden_size;
  const std::int64_t ff = c.intermediate_size;
  std::vector<LayerTensor> t = {
      {"self_attn.q_proj.weight", {c.q_dim(), h}, K::kMatrix, &W::wq},
      {"self_attn.k_proj.weight", {c.kv_dim(), h}, K::kMatrix, &W::wk},
      {"self_attn.v_proj.weight", {c.kv_dim(), h}, K::kMatrix, &W::wv},
      {"self_attn.o_proj.weight", {h, c.q_dim()}, K::kMatrix, &W::wo},
      {"self_attn.q_norm.weight", {c.q_dim()}, K::kNorm, &W::q_norm},
      {"self_attn.k_norm.weight", {c.kv_dim()}, K::kNorm, &W::k_norm},
      {"post_attention_layernorm.weight", {h}, K::kNorm, &W::attn_post_norm},
      {"mlp.gate_proj.weight", {ff, h}, K::kMatrix, &W::w_gate},
      {"mlp.up_proj.weight", {ff, h}, K::kMatrix, &W::w_up},
      {"mlp.down_proj.weight", {h, ff}, K::kMatrix, &W::w_down},
      {"post_feedforward_layernorm.weight", {h}, K::kNorm, &W::mlp_post_norm}};
  if (c.qkv_bias) {
    t.push_back({"self_attn.q_proj.bias", {c.q_dim()}, K::kBias, &W::bq});
    t.push_back({"self_attn.k_proj.bias", {c.kv_dim()}, K::kBias, &W::bk});
    t.push_back({"self_attn.v_proj.bias", {c.kv_dim()}, K::kBias, &W::bv});
    t.push_back({"self_attn.o_proj.bias", {h}, K::kBias, &W::bo});
  }
  return t;
}

void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  const int qd = static_cast<int>(c.q_dim());
  const int kvd = static_cast<int>(c.kv_dim());
  const Ops::Projection qkv[3] = {{l.w.wq, l.w.bq, qd, a.q, false},
                                  {l.w.wk, l.w.bk, kvd, a.k, false},
                                  {l.w.wv, l.w.bv, kvd, a.v, false}};
  l.ops.linear_many(x, n, c.hidden_size, qkv, 3);
  l.ops.rms_norm(a.q, n, qd, l.w.q_norm, a.q);
  l.ops.rms_norm(a.k, n, kvd, l.w.k_norm, a.k);
  l.ops.rope(a.q, a.k, n, positions, first_position, l.local_rope);
}

void attention_output(const LayerContext& l, float* x, int n) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  const int h = c.hidden_size;
  l.ops.linear(a.attn, n, static_cast<int>(c.q_dim()), l.w.wo, l.w.bo, h, a.xnorm, false);
  l.ops.rms_norm(a.xnorm, n, h, l.w.attn_post_norm, a.xnorm);
  l.ops.add(x, a.xnorm, static_cast<std::int64_t>(n) * h, 1.0f);
}

void mlp(const LayerContext& l, float* x, int n) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  const int h = c.hidden_size;
  const int ff = c.intermediate_size;
  const Ops::Projection gate_up[2] = {{l.w.w_gate, nullptr, ff, a.gate, false},
                                      {l.w.w_up, nullptr, ff, a.up, false}};
  l.ops.linear_many(x, n, h, gate_up, 2);
  l.ops.gated_activation(a.gate, a.up, static_cast<std::int64_t>(n) * ff);
  l.ops.linear(a.gate, n, ff, l.w.w_down, nullptr, h, a.xnorm, false);
  l.ops.rms_norm(a.xnorm, n, h, l.w.mlp_post_norm, a.xnorm);
  l.ops.add(x, a.xnorm, static_cast<std::int64_t>(n) * h, 1.0f);
}

}  // namespace
}  // namespace olmo2

// OLMo 2's config: attention_bias puts biases on q, k, v and the output projection alike.
extern const Family kOlmo2Family;
const Family kOlmo2Family = {
    "olmo2",
    {"Olmo2ForCausalLM"},
    [](ModelConfig&) {},
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) { o["attention_bias"] = c.qkv_bias; },
    olmo2::layer_tensors,
    olmo2::attention_inputs,
    olmo2::attention_output,
    olmo2::mlp};

}  // namespace kvo::model
