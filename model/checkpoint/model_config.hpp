// The shape of a decoder as Hugging Face's config.json describes it (Llama 2/3/3.1, Mistral,
// Qwen2, Qwen3, Phi-3, Gemma 2 and 3), and the built-in presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/common/rope.hpp"

namespace kvo::model {

// The MLP's gate activation: silu (SwiGLU) or GeLU with the tanh approximation (Gemma's
// gelu_pytorch_tanh).
enum class Activation { kSilu, kGeluTanh };

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
  // Reals as config.json states them (the kernels take them as float): a saved context's
  // fingerprint records them exactly.
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // rope_scaling / rope_parameters: its type and parameters
  int max_position_embeddings = 4096;
  int sliding_window = 0;  // Mistral: attend to the last N keys; 0: full attention
  // Gemma: which layers attend through the window (layer_types' "sliding_attention"); empty:
  // every layer does when sliding_window is set.
  std::vector<std::uint8_t> sliding_layers;
  Activation hidden_act = Activation::kSilu;
  double attn_softcap = 0;   // Gemma 2: scores become cap * tanh(score / cap); 0: none
  double final_softcap = 0;  // Gemma 2: the same on the logits (its family's logits hook)
  // Gemma: the scores are scaled by query_pre_attn_scalar^-1/2 (its family's attention_scale).
  float query_pre_attn_scalar = 0;
  // Gemma 3: the window layers rotate with this base and no scaling (the full layers with
  // rope_theta and rope_scaling); 0: every layer rotates alike.
  double rope_local_theta = 0;
  // Granite: the embeddings, each branch as it joins the residual, and the scores (in place of
  // head_dim^-1/2) are multiplied by these, the logits divided by logits_scaling; 1: none.
  double embedding_multiplier = 1;
  double residual_multiplier = 1;
  double attention_multiplier = 1;
  double logits_scaling = 1;
  bool qkv_bias = false;  // Qwen2, or Llama's attention_bias
  bool o_bias = false;    // Llama's attention_bias
  bool tie_word_embeddings = false;
  DType dtype = DType::kBF16;  // torch_dtype / dtype of the checkpoint

  std::int64_t q_dim() const { return static_cast<std::int64_t>(heads) * head_dim; }
  std::int64_t kv_dim() const { return static_cast<std::int64_t>(kv_heads) * head_dim; }
  // The window of `layer`'s attention (its last N keys), 0 for full attention.
  int window(int layer) const {
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<std::size_t>(layer)] != 0 ? sliding_window : 0;
  }
  bool windowed() const {
    for (int l = 0; l < layers; ++l) {
      if (window(l) > 0) return true;
    }
    return false;
  }
  // Whether `layer` rotates with the local table (rope_local_theta).
  bool local_rope(int layer) const { return rope_local_theta > 0 && window(layer) > 0; }
  // The factor on q . k: the family's (model/families/family.hpp), else head_dim^-1/2.
  double attention_scale() const;
  // What every RMSNorm's weight is offset by: the family's (Gemma: 1), else 0.
  float norm_offset() const;
};

// The largest value each dimension may take, stated so that every size derived from a config
// (weights, activations, a tensor's byte count) is far from overflowing and an absurd config is
// refused before anything is allocated. Real Llama-family models stay well inside: Llama 3.1
// 405B has 126 layers, hidden 16384, intermediate 53248, 128 heads, vocab 128256.
struct ModelLimits {
  static constexpr int kVocab = 1 << 22;         // 4,194,304
  static constexpr int kHidden = 1 << 16;        // 65,536
  static constexpr int kIntermediate = 1 << 20;  // 1,048,576
  static constexpr int kLayers = 1024;
  static constexpr int kHeads = 1024;  // attention heads and KV heads
  static constexpr int kHeadDim = 1024;
  static constexpr int kPositions = 1 << 30;  // max_position_embeddings, sliding_window
};

// The factor on the embeddings: the family's (model/families/family.hpp), 1 where it has none.
float embedding_scale(const ModelConfig& config, DType weights);

// "silu", "gelu_pytorch_tanh": as config.json names them.
const char* activation_name(Activation act);

// Reads config.json (its text, `source` names it in errors). Throws kvo::Error(kInvalidArgument)
// for malformed JSON, a missing or out-of-range field, or an unsupported architecture, naming it.
// Integer fields must be JSON integers within ModelLimits.
// The largest config.json read.
inline constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{16} << 20;

// What a model directory's files may be, for --help: each a regular file within its bound,
// "config.json 16 MiB, ..., each .safetensors file 1 TiB".
std::string model_file_bounds();

ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& path);

// Checks every dimension against ModelLimits and the relations between fields (heads divisible
// by kv_heads, even head_dim, ...). Throws kvo::Error(kInvalidArgument) naming the field.
void validate(const ModelConfig& config);

// Built-in shapes by name: tiny, llama3-8b, mistral-7b, qwen2.5-7b, qwen3-8b, mistral-nemo-12b,
// phi3-mini-128k, gemma3-12b.
// Throws for an unknown name, listing the known ones.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();
// The config.json text a preset is read from (model/checkpoint/presets.cpp); empty for an unknown
// name.
std::string preset_config_json(const std::string& name);

// config.json text for `config`, as Hugging Face writes it (enough for transformers to load).
std::string to_config_json(const ModelConfig& config);

// The rope table of a forward of `config` whose highest position is seq_len - 1 (rope_table of
// its scaling, base, head size and pretraining length), and its schedule, forward by forward.
RopeTable rope_table(const ModelConfig& config, std::int64_t seq_len);
RopeSchedule rope_schedule(const ModelConfig& config);

// Parameter count and bytes of the weights in `dtype`.
std::int64_t parameter_count(const ModelConfig& config);

}  // namespace kvo::model
