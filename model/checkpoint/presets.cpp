// The built-in shapes, each the config.json a checkpoint of that shape carries, read by the same
// parser as a model directory's (parse_model_config): a preset says nothing a config cannot, and
// what its family derives (Gemma's norm offset, its windows' rope base) is derived as for any
// checkpoint.
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"

namespace kvo::model {
namespace {

struct Preset {
  const char* name;
  const char* config_json;
};

const Preset kPresets[] = {
    // A few layers of a Llama-3-like shape: fast enough for tests and the default demo; head_dim
    // 64, a head size FlashInfer's kernels serve, so the demo uses them on a GPU.
    {"tiny", R"json({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 4096,
  "hidden_size": 256,
  "intermediate_size": 688,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 64,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": true,
  "rope_parameters": {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0
  },
  "attention_bias": false,
  "torch_dtype": "float32"
})json"},
    // Llama 3.1 8B: rope llama3, factor 8 over 8192.
    {"llama3-8b", R"json({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 128256,
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0
  },
  "attention_bias": false,
  "torch_dtype": "bfloat16"
})json"},
    // Mistral 7B v0.3.
    {"mistral-7b", R"json({
  "architectures": ["MistralForCausalLM"],
  "model_type": "mistral",
  "vocab_size": 32768,
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 32768,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "default",
    "rope_theta": 1000000.0
  },
  "torch_dtype": "bfloat16"
})json"},
    // Qwen2.5 7B: q, k and v with biases.
    {"qwen2.5-7b", R"json({
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "vocab_size": 152064,
  "hidden_size": 3584,
  "intermediate_size": 18944,
  "num_hidden_layers": 28,
  "num_attention_heads": 28,
  "num_key_value_heads": 4,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 32768,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "default",
    "rope_theta": 1000000.0
  },
  "torch_dtype": "bfloat16"
})json"},
    // Qwen3-8B as served at 128K: yarn, factor 4 over its 32K.
    {"qwen3-8b", R"json({
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "vocab_size": 151936,
  "hidden_size": 4096,
  "intermediate_size": 12288,
  "num_hidden_layers": 36,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32768,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": true,
    "attention_factor": 1.138629436111989
  },
  "attention_bias": false,
  "use_sliding_window": false,
  "torch_dtype": "bfloat16"
})json"},
    // Mistral Nemo: head_dim 128 where hidden / heads is 160.
    {"mistral-nemo-12b", R"json({
  "architectures": ["MistralForCausalLM"],
  "model_type": "mistral",
  "vocab_size": 131072,
  "hidden_size": 5120,
  "intermediate_size": 14336,
  "num_hidden_layers": 40,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "default",
    "rope_theta": 1000000.0
  },
  "torch_dtype": "bfloat16"
})json"},
    // Phi-3-mini-128k's shape: head_dim 96, every head its own KV head, longrope from 4K. Its
    // factors here are a smooth ramp, not the released ones (a preset is a shape and its bytes).
    {"phi3-mini-128k", R"json({
  "architectures": ["Phi3ForCausalLM"],
  "model_type": "phi3",
  "vocab_size": 32064,
  "hidden_size": 3072,
  "intermediate_size": 8192,
  "num_hidden_layers": 32,
  "num_attention_heads": 32,
  "num_key_value_heads": 32,
  "head_dim": 96,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": false,
  "rope_parameters": {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "attention_factor": 1.1902380714238083,
    "short_factor": [1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16, 1.18, 1.2, 1.22, 1.24,
       1.26, 1.28, 1.3, 1.32, 1.34, 1.36, 1.38, 1.4, 1.42, 1.44, 1.46, 1.48, 1.5, 1.52, 1.54,
       1.56, 1.58, 1.6, 1.62, 1.64, 1.66, 1.68, 1.7, 1.72, 1.74, 1.76, 1.78, 1.8, 1.82, 1.84,
       1.86, 1.88, 1.9, 1.92, 1.94],
    "long_factor": [1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6, 5.2, 5.8, 6.4, 7.0, 7.6, 8.2, 8.8, 9.4,
       10.0, 10.6, 11.2, 11.8, 12.4, 13.0, 13.6, 14.2, 14.8, 15.4, 16.0, 16.6, 17.2, 17.8, 18.4,
       19.0, 19.6, 20.2, 20.8, 21.4, 22.0, 22.6, 23.2, 23.8, 24.4, 25.0, 25.6, 26.2, 26.8, 27.4,
       28.0, 28.6, 29.2]
  },
  "original_max_position_embeddings": 4096,
  "torch_dtype": "bfloat16"
})json"},
    // Gemma 3 12B's text model at 128K: 48 layers, one full layer in six (the others windows of
    // 1024 keys rotating at base 10000), head_dim 256, linear rope scaling 8 on the full layers.
    {"gemma3-12b", R"json({
  "architectures": ["Gemma3ForCausalLM"],
  "model_type": "gemma3_text",
  "vocab_size": 262208,
  "hidden_size": 3840,
  "intermediate_size": 15360,
  "num_hidden_layers": 48,
  "num_attention_heads": 16,
  "num_key_value_heads": 8,
  "head_dim": 256,
  "rms_norm_eps": 1e-06,
  "max_position_embeddings": 131072,
  "tie_word_embeddings": true,
  "rope_parameters": {
    "full_attention": {
      "rope_type": "linear",
      "rope_theta": 1000000.0,
      "factor": 8.0
    },
    "sliding_attention": {
      "rope_type": "default",
      "rope_theta": 10000.0
    }
  },
  "hidden_activation": "gelu_pytorch_tanh",
  "attention_bias": false,
  "query_pre_attn_scalar": 256,
  "sliding_window": 1024,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
     "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
     "full_attention"],
  "torch_dtype": "bfloat16"
})json"},
};

}  // namespace

ModelConfig preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return parse_model_config(p.config_json, "the preset " + name);
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown preset \"" + name + "\" (known: " + known + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::string preset_config_json(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config_json;
  }
  return {};
}

}  // namespace kvo::model
