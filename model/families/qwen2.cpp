// Qwen2 and Qwen2.5 (Qwen2ForCausalLM): the Llama block with biases on q, k and v, always.
#include "model/families/llama.hpp"

namespace kvo::model {

extern const Family kQwen2Family;
const Family kQwen2Family = {
    "qwen2",
    {"Qwen2ForCausalLM"},
    [](ModelConfig& c) { c.qkv_bias = true; },
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = true;
      if (f.boolean_or("use_sliding_window", false)) {
        throw f.at("use_sliding_window").error("true is not supported for Qwen2");
      }
    },
    [](const ModelConfig&, nlohmann::ordered_json&) {},
    llama::layer_tensors,
    llama::attention_inputs,
    llama::attention_output,
    llama::mlp};

}  // namespace kvo::model
