// A model family: what one kind of decoder reads from and writes to config.json beyond the
// fields every family shares, which tensors each of its layers holds and where each is bound,
// and how a layer computes around the cache: its attention's inputs and output, and its MLP.
// One file a family (model/families/<model_type>.cpp); the registry (families.cpp) finds them.
// Adding a family touches its file, the registry and model/CMakeLists.txt.
//
// The decoder runs every layer the same way, through these hooks:
//   attention_inputs(x) -> a.q, a.k, a.v   the rows go to the cache (appended, in its format),
//   attention over the cache -> a.attn     attention_output: x += ...(a.attn)
//   mlp: x += ...(x)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/decoder/ops.hpp"

namespace kvo::model {

struct ActivationLayout;

// One tensor of every layer: its name after "model.layers.N.", its shape, how synthetic values
// are drawn for it, and the member of LayerWeights it binds to.
struct LayerTensor {
  LayerTensor(std::string name_, std::vector<std::int64_t> shape_, WeightKind kind_,
              const void* LayerWeights::*vector_)
      : name(std::move(name_)), shape(std::move(shape_)), kind(kind_), vector(vector_) {}
  LayerTensor(std::string name_, std::vector<std::int64_t> shape_, WeightKind kind_,
              WeightRef LayerWeights::*matrix_)
      : name(std::move(name_)), shape(std::move(shape_)), kind(kind_), matrix(matrix_) {}
  std::string name;
  std::vector<std::int64_t> shape;
  WeightKind kind = WeightKind::kMatrix;
  const void* LayerWeights::*vector = nullptr;  // a norm or a bias
  WeightRef LayerWeights::*matrix = nullptr;    // a matrix
};

// What one layer computes with: the ops, the config, the layer's weights and the activations'
// buffers (model/decoder/memory_plan.hpp).
struct LayerContext {
  Ops& ops;
  const ModelConfig& config;
  const LayerWeights& w;
  ActivationLayout& a;
  DType weight_dtype;       // of w's tensors (a fused tensor's parts lie at offsets of it)
  bool local_rope = false;  // the layer rotates with the window layers' table (Gemma 3)
};

struct Family {
  const char* model_type = "";             // config.json's model_type, e.g. "llama"
  std::vector<const char*> architectures;  // config.json's architectures, e.g. "LlamaForCausalLM"
  // What every model of the family has whatever config.json says (Qwen2: q, k and v biases;
  // Gemma: its norms, activation and window layers for c.layers), for a config made without
  // config.json (kvo-make-model, once its dimensions are set). Keeps a window c already has.
  void (*settle)(ModelConfig& c) = nullptr;
  // The family's own config.json fields, read into c after the shared ones; errors name the
  // field (strict_json.hpp).
  void (*read_config)(const JsonField& config, ModelConfig& c) = nullptr;
  // The same fields written, as transformers writes them.
  void (*write_config)(const ModelConfig& c, nlohmann::ordered_json& config) = nullptr;
  // The tensors of one layer, in checkpoint order.
  std::vector<LayerTensor> (*layer_tensors)(const ModelConfig& c) = nullptr;
  // a.q [n][heads][head_dim], a.k and a.v [n][kv_heads][head_dim] from x [n][hidden], q and k
  // rotated to their positions: positions [n] (device), or first_position + i when null.
  void (*attention_inputs)(const LayerContext& l, const float* x, int n,
                           const std::int32_t* positions, int first_position) = nullptr;
  // x [n][hidden] += the layer's output of the attention a.attn [n][heads][head_dim].
  void (*attention_output)(const LayerContext& l, float* x, int n) = nullptr;
  // x [n][hidden] += the layer's MLP of x.
  void (*mlp)(const LayerContext& l, float* x, int n) = nullptr;
  // Older names of rope types the family's configs use, as {name, meaning} (Phi-3: su and yarn
  // mean longrope).
  std::vector<std::pair<const char*, const char*>> rope_aliases = {};
  // The pretraining length the family's config class gives when config.json has no top-level
  // original_max_position_embeddings (Phi-3: 4096, over the scaling block's); 0: none.
  int original_max_position = 0;
  // The factor on the embeddings, as transformers multiplies by it for weights of `weights`
  // (Gemma: sqrt(hidden_size) rounded to that dtype); null: 1.
  float (*embedding_scale)(const ModelConfig& c, DType weights) = nullptr;
  // The factor on the attention's scores (Gemma: query_pre_attn_scalar^-1/2); null:
  // head_dim^-1/2.
  double (*attention_scale)(const ModelConfig& c) = nullptr;
  // What the family does to the logits [count] after the head (Gemma 2: its soft cap); null:
  // nothing.
  void (*logits)(Ops& ops, const ModelConfig& c, float* logits, std::int64_t count) = nullptr;
  // What every RMSNorm's weight is offset by: x * (norm_offset + weight) (Gemma: 1). A property
  // of the family, never a config field.
  float norm_offset = 0;
};

// config.json's hidden_act (or Gemma's hidden_activation, `key`): silu or gelu_pytorch_tanh;
// anything else is refused naming the field.
Activation parse_activation(const JsonField& config, const char* key);
// A rope block (rope_scaling, rope_parameters, or one layer type's entry of Gemma 3's
// rope_parameters) into c.rope_theta and c.rope_scaling, with transformers' defaults. Needs
// max_position_embeddings and head_dim read.
void read_rope_scaling(const JsonField& config, const JsonField& block, ModelConfig& c,
                       const Family& family);

// The family serving an architecture (config.json's architectures[0]), or a model_type (when
// config.json names no architecture). Throw kvo::Error(kInvalidArgument) "<source>: ..." naming
// the architectures served.
const Family& family_of_architecture(const std::string& architecture, const std::string& source);
const Family& family_of_model_type(const std::string& model_type, const std::string& source);
// "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"
std::string served_architectures();
// {"llama", "mistral", "qwen2"}: kvo-make-model's --arch.
std::vector<std::string> family_model_types();

}  // namespace kvo::model
