// The shape of a Llama-family decoder as Hugging Face's config.json describes it (Llama 2/3/3.1,
// Mistral, Qwen2), and the built-in presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/numerics.hpp"

namespace kvo::model {

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // architectures[0]
  std::string model_type = "llama";
  int vocab_size = 32000;
  int hidden_size = 4096;
  int intermediate_size = 11008;
  int layers = 32;     // num_hidden_layers
  int heads = 32;      // num_attention_heads
  int kv_heads = 32;   // num_key_value_heads
  int head_dim = 128;  // head_dim, else hidden_size / heads
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // llama3 scaling; factor 0: none
  int max_position_embeddings = 4096;
  int sliding_window = 0;  // Mistral: attend to the last N keys; 0: full attention
  bool qkv_bias = false;   // Qwen2, or Llama's attention_bias
  bool o_bias = false;     // Llama's attention_bias
  bool tie_word_embeddings = false;
  DType dtype = DType::kBF16;  // torch_dtype / dtype of the checkpoint

  std::int64_t q_dim() const { return static_cast<std::int64_t>(heads) * head_dim; }
  std::int64_t kv_dim() const { return static_cast<std::int64_t>(kv_heads) * head_dim; }
};

// Reads config.json (its text, `source` names it in errors). Throws kvo::Error(kInvalidArgument)
// for malformed JSON, a missing or out-of-range field, or an unsupported architecture, naming it.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& path);

// Checks the relations between fields (heads divisible by kv_heads, even head_dim, ...).
void validate(const ModelConfig& config);

// Built-in shapes by name: tiny, llama3-8b, mistral-7b, qwen2.5-7b. Throws for an unknown name,
// listing the known ones.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// config.json text for `config`, as Hugging Face writes it (enough for transformers to load).
std::string to_config_json(const ModelConfig& config);

// Parameter count and bytes of the weights in `dtype`.
std::int64_t parameter_count(const ModelConfig& config);

}  // namespace kvo::model
