// Gemma 3 text (Gemma3ForCausalLM): the Gemma block (gemma.hpp) without soft-capping, with
// Qwen3's RMSNorm of each query and key head (q_norm, k_norm; (1 + w) as every Gemma norm)
// before the rotation, five window layers to one full layer, and two rotations: the full layers'
// (rope_theta with the scaling block, linear 8 in the 4B to 27B models) and the window layers'
// (their own base, unscaled). config.json gives them as rope_parameters keyed by layer type, or in
// older files as rope_theta, rope_scaling and rope_local_base_freq.
#include "model/decoder/memory_plan.hpp"
#include "model/families/gemma.hpp"
#include "model/families/qwen3.hpp"

namespace kvo::model {

extern const Family kGemma3Family;

namespace gemma3 {

void read_config(const JsonField& f, ModelConfig& c) {
  const int pattern = static_cast<int>(
      f.integer_or("sliding_window_pattern", f.integer_or("_sliding_window_pattern", 6, 1, 1 << 20),
                   1, 1 << 20));
  gemma::read_config(f, c, 0, 0, 4096, 131072, pattern);
  c.rope_local_theta = f.real_or("rope_local_base_freq", 10000.0);
  const auto params = f.find("rope_parameters");
  if (!params || !params->json().is_object() || !params->json().contains("full_attention")) {
    return;  // the older form: the shared reader took rope_theta and rope_scaling
  }
  read_rope_scaling(f, params->at("full_attention"), c, kGemma3Family);
  if (const auto local = params->find("sliding_attention")) {
    local->require_object();
    const std::string type = local->text_or("rope_type", local->text_or("type", "default"));
    if (type != "default") {
      throw local->error("rope_type \"" + type +
                         "\" is not supported for the window layers (supported: default)");
    }
    c.rope_local_theta = local->real_or("rope_theta", c.rope_local_theta);
  }
}

void write_config(const ModelConfig& c, nlohmann::ordered_json& o) {
  gemma::write_config(c, o);
  // rope_parameters keyed by layer type, as transformers writes Gemma 3's.
  const nlohmann::ordered_json full = o["rope_parameters"];
  o["rope_parameters"] = {
      {"full_attention", full},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rope_local_theta}}}};
}

}  // namespace gemma3

const Family kGemma3Family = {
    "gemma3_text",
    {"Gemma3ForCausalLM"},
    [](ModelConfig& c) {
      gemma::settle(c, 1024, 6);  // the window of the 4B to 27B models
      c.rope_local_theta = 10000;
    },
    gemma3::read_config,
    gemma3::write_config,
    [](const ModelConfig& c) { return qwen3::with_head_norms(gemma::layer_tensors(c), c); },
    qwen3::attention_inputs,
    gemma::attention_output,
    gemma::mlp,
    {},
    0,
    gemma::embedding_scale,
    gemma::attention_scale,
    gemma::logits,
    1.0f};

}  // namespace kvo::model
