// Mistral (MistralForCausalLM): the Llama block with a sliding window over the keys.
#include "model/families/llama.hpp"

namespace kvo::model {

extern const Family kMistralFamily;
const Family kMistralFamily = {
    "mistral",
    {"MistralForCausalLM"},
    [](ModelConfig&) {},
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
      c.sliding_window =
          static_cast<int>(f.integer_or("sliding_window", 0, 1, ModelLimits::kPositions));
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) {
      o["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window)
                                                 : nlohmann::ordered_json(nullptr);
    },
    llama::layer_tensors,
    llama::attention_inputs,
    llama::attention_output,
    llama::mlp};

}  // namespace kvo::model
