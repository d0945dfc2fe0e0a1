// A GGUF file's model, as config.json would describe it: the architecture and hyperparameters in
// its metadata mapped to the fields transformers maps them to (its GGUF loader), then read and
// validated as any config.json is (model_config.hpp), so a GGUF model and its safetensors twin
// get the same ModelConfig.
#pragma once

#include <string>

#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/model_config.hpp"

namespace kvo::model {

// config.json's text for the model in `file`. Throws kvo::Error(kInvalidArgument) naming the file
// and the key: an architecture the decoder does not serve (general.architecture), a missing or
// mistyped hyperparameter, a rope this reader does not map (Llama 3's factors stored as the
// rope_freqs.weight tensor).
std::string gguf_config_json(const GgufFile& file);

// parse_model_config(gguf_config_json(file)).
ModelConfig gguf_model_config(const GgufFile& file);

}  // namespace kvo::model
