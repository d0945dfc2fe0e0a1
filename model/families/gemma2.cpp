// Gemma 2 (Gemma2ForCausalLM), and the block Gemma 3 shares (gemma.hpp): the embeddings scaled
// by sqrt(hidden_size); every RMSNorm multiplying by (1 + weight) (the family's norm_offset); a
// norm before and after the attention and before and after the MLP, the "after" ones on the
// branch before it joins the residual; a GeLU-tanh gated MLP; the scores scaled by
// query_pre_attn_scalar^-1/2 and, in Gemma 2, soft-capped (attn_logit_softcapping), as are the
// final logits (final_logit_softcapping); window layers and full layers alternating
// (layer_types).
#include "model/families/gemma.hpp"

#include <cmath>

#include "model/common/numerics.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/families/llama.hpp"

namespace kvo::model {
namespace gemma {

namespace {

// A soft-capping field: absent, its default; null, none (0); else positive.
double softcap(const JsonField& f, const char* key, double fallback) {
  if (!f.json().contains(key)) return fallback;
  if (f.json().at(key).is_null()) return 0;
  const double value = f.at(key).real();
  if (!(value > 0)) throw f.at(key).error("must be positive (or null for none)");
  return value;
}

}  // namespace

std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  using K = WeightKind;
  using W = LayerWeights;
  const std::int64_t h = c.hidden_size;
  std::vector<LayerTensor> t = llama::attention_tensors(c);
  t.push_back({"post_attention_layernorm.weight", {h}, K::kNorm, &W::attn_post_norm});
  t.push_back({"pre_feedforward_layernorm.weight", {h}, K::kNorm, &W::mlp_norm});
  t.push_back({"post_feedforward_layernorm.weight", {h}, K::kNorm, &W::mlp_post_norm});
  llama::mlp_tensors(c, t);
  return t;
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
  ActivationLayout& a = l.a;
  const int h = l.config.hidden_size;
  llama::mlp_branch(l, x, n, l.w.w_up, a.xnorm, false);
  l.ops.rms_norm(a.xnorm, n, h, l.w.mlp_post_norm, a.xnorm);
  l.ops.add(x, a.xnorm, static_cast<std::int64_t>(n) * h, 1.0f);
}

float embedding_scale(const ModelConfig& c, DType weights) {
  float scale = std::sqrt(static_cast<float>(c.hidden_size));
  if (weights == DType::kBF16) scale = bf16_to_float(float_to_bf16(scale));
  if (weights == DType::kF16) scale = f16_to_float(float_to_f16(scale));
  return scale;
}

double attention_scale(const ModelConfig& c) {
  const double scalar = c.query_pre_attn_scalar > 0 ? static_cast<double>(c.query_pre_attn_scalar)
                                                    : static_cast<double>(c.head_dim);
  return 1.0 / std::sqrt(scalar);
}

void logits(Ops& ops, const ModelConfig& c, float* logits, std::int64_t count) {
  if (c.final_softcap > 0) ops.soft_cap(logits, count, static_cast<float>(c.final_softcap));
}

void settle(ModelConfig& c, int window, int pattern) {
  c.hidden_act = Activation::kGeluTanh;
  if (c.sliding_window == 0) c.sliding_window = window;
  sliding_pattern(c, pattern);
}

void sliding_pattern(ModelConfig& c, int pattern) {
  c.sliding_layers.assign(static_cast<std::size_t>(c.layers), 0);
  for (int i = 0; i < c.layers; ++i) {
    c.sliding_layers[static_cast<std::size_t>(i)] = (i + 1) % pattern != 0 ? 1 : 0;
  }
}

void read_config(const JsonField& f, ModelConfig& c, double attn_softcap, double final_softcap,
                 int window, int max_position, int pattern) {
  c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
  // Gemma's classes default these differently from the shared reader.
  c.head_dim = static_cast<int>(f.integer_or("head_dim", 256, 2, ModelLimits::kHeadDim));
  c.max_position_embeddings = static_cast<int>(
      f.integer_or("max_position_embeddings", max_position, 1, ModelLimits::kPositions));
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", true);
  // The MLP reads hidden_activation (hidden_act is kept for older configs).
  c.hidden_act = f.find("hidden_activation") ? parse_activation(f, "hidden_activation")
                                             : Activation::kGeluTanh;
  c.query_pre_attn_scalar = static_cast<float>(
      f.integer_or("query_pre_attn_scalar", 256, 1, ModelLimits::kHidden * ModelLimits::kHeads));
  c.attn_softcap = softcap(f, "attn_logit_softcapping", attn_softcap);
  c.final_softcap = softcap(f, "final_logit_softcapping", final_softcap);
  if (f.boolean_or("use_bidirectional_attention", false)) {
    throw f.at("use_bidirectional_attention").error("true is not supported (a decoder is causal)");
  }
  c.sliding_window =
      static_cast<int>(f.integer_or("sliding_window", window, 1, ModelLimits::kPositions));
  sliding_pattern(c, pattern);  // as the config classes derive them, unless listed
  if (const auto types = f.find("layer_types")) {
    const std::vector<JsonField> names = types->elements();
    if (static_cast<int>(names.size()) != c.layers) {
      throw types->error("has " + std::to_string(names.size()) + " entries for " +
                         std::to_string(c.layers) + " layers");
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string& type = names[i].text();
      if (type != "sliding_attention" && type != "full_attention") {
        throw names[i].error("must be \"sliding_attention\" or \"full_attention\"");
      }
      c.sliding_layers[i] = type == "sliding_attention" ? 1 : 0;
    }
  }
}

void write_config(const ModelConfig& c, nlohmann::ordered_json& o) {
  o.erase("hidden_act");
  o["hidden_activation"] = activation_name(c.hidden_act);
  o["attention_bias"] = c.qkv_bias;
  // An integer, as transformers' classes require.
  o["query_pre_attn_scalar"] = c.query_pre_attn_scalar > 0
                                   ? static_cast<std::int64_t>(c.query_pre_attn_scalar)
                                   : static_cast<std::int64_t>(c.head_dim);
  o["sliding_window"] = c.sliding_window;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (int i = 0; i < c.layers; ++i) {
    types.push_back(c.window(i) > 0 ? "sliding_attention" : "full_attention");
  }
  o["layer_types"] = types;
  const auto cap = [](double v) {
    return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  };
  o["attn_logit_softcapping"] = cap(c.attn_softcap);
  o["final_logit_softcapping"] = cap(c.final_softcap);
}

}  // namespace gemma

extern const Family kGemma2Family;
const Family kGemma2Family = {"gemma2",
                              {"Gemma2ForCausalLM"},
                              [](ModelConfig& c) {
                                gemma::settle(c, 4096, 2);
                                c.attn_softcap = 50;
                                c.final_softcap = 30;
                              },
                              [](const JsonField& f, ModelConfig& c) {
                                // Gemma 2's class: capped at 50 and 30, a window of 4096 on every
                                // other layer from the first.
                                gemma::read_config(f, c, 50.0, 30.0, 4096, 8192, 2);
                              },
                              gemma::write_config,
                              gemma::layer_tensors,
                              llama::attention_inputs,
                              gemma::attention_output,
                              gemma::mlp,
                              {},
                              0,
                              gemma::embedding_scale,
                              gemma::attention_scale,
                              gemma::logits,
                              1.0f};

}  // namespace kvo::model
