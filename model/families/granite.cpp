// Granite (GraniteForCausalLM): the Llama block with four scales its config states: the
// embeddings multiplied by embedding_multiplier, each branch (attention and MLP) by
// residual_multiplier before it joins the residual, the scores by attention_multiplier (in place
// of head_dim^-1/2), and the logits divided by logits_scaling.
#include <cmath>

#include "model/decoder/memory_plan.hpp"
#include "model/families/llama.hpp"

namespace kvo::model {
namespace granite {
namespace {

// The residual's branch in a.xnorm, then x += residual_multiplier * branch.
void join(const LayerContext& l, float* x, int n) {
  const std::int64_t count = static_cast<std::int64_t>(n) * l.config.hidden_size;
  l.ops.add(x, l.a.xnorm, count, static_cast<float>(l.config.residual_multiplier));
}

void attention_output(const LayerContext& l, float* x, int n) {
  const ModelConfig& c = l.config;
  l.ops.linear(l.a.attn, n, static_cast<int>(c.q_dim()), l.w.wo, l.w.bo, c.hidden_size, l.a.xnorm,
               false);
  join(l, x, n);
}

void mlp(const LayerContext& l, float* x, int n) {
  llama::mlp_branch(l, x, n, l.w.w_up, l.a.xnorm, false);
  join(l, x, n);
}

// A multiplier of config.json: absent, 1; else positive and finite.
double multiplier(const JsonField& f, const char* key) {
  if (!f.find(key)) return 1;
  const double value = f.at(key).real();
  if (!(value > 0) || !std::isfinite(value)) {
    throw f.at(key).error("must be positive and finite");
  }
  return value;
}

}  // namespace
}  // namespace granite

extern const Family kGraniteFamily;
const Family kGraniteFamily = {
    "granite",
    {"GraniteForCausalLM"},
    [](ModelConfig& c) {
      // A made model's: Granite 3's scales (its 2B model's), the scores' by 1 / head_dim.
      c.embedding_multiplier = 12;
      c.residual_multiplier = 0.22;
      c.attention_multiplier = 1.0 / c.head_dim;
      c.logits_scaling = 8;
    },
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
      c.embedding_multiplier = granite::multiplier(f, "embedding_multiplier");
      c.residual_multiplier = granite::multiplier(f, "residual_multiplier");
      c.attention_multiplier = granite::multiplier(f, "attention_multiplier");
      c.logits_scaling = granite::multiplier(f, "logits_scaling");
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) {
      o["attention_bias"] = c.qkv_bias;
      o["embedding_multiplier"] = c.embedding_multiplier;
      o["residual_multiplier"] = c.residual_multiplier;
      o["attention_multiplier"] = c.attention_multiplier;
      o["logits_scaling"] = c.logits_scaling;
    },
    llama::layer_tensors,
    llama::attention_inputs,
    granite::attention_output,
    granite::mlp,
    {},
    0,
    [](const ModelConfig& c, DType) { return static_cast<float>(c.embedding_multiplier); },
    [](const ModelConfig& c) { return c.attention_multiplier; },
    [](Ops& ops, const ModelConfig& c, float* logits, std::int64_t count) {
      ops.scale(logits, count, static_cast<float>(1 / c.logits_scaling));
    }};

}  // namespace kvo::model
