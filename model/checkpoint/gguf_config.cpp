#include "model/checkpoint/gguf_config.hpp"

#include <nlohmann/json.hpp>

#include "kvoffload/error.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

struct Architecture {
  const char* gguf;  // general.architecture
  const char* hf;    // config.json's architectures[0]
};
// The decoder's families, by the names GGUF gives them (Mistral's files say "llama").
constexpr Architecture kArchitectures[] = {{"llama", "LlamaForCausalLM"},
                                           {"qwen2", "Qwen2ForCausalLM"},
                                           {"qwen3", "Qwen3ForCausalLM"},
                                           {"phi3", "Phi3ForCausalLM"}};

}  // namespace

std::string gguf_config_json(const GgufFile& file) {
  const std::string arch = file.text("general.architecture");
  const Architecture* served = nullptr;
  std::string names;
  for (const Architecture& a : kArchitectures) {
    if (arch == a.gguf) served = &a;
    names += (names.empty() ? "" : ", ") + std::string(a.gguf);
  }
  if (served == nullptr) {
    throw invalid(file.path() + ": general.architecture \"" + printable(arch) +
                  "\" is not served (served: " + names + ")");
  }
  const std::string p = arch + ".";
  nlohmann::ordered_json c;
  c["architectures"] = {served->hf};
  c["hidden_size"] = file.integer(p + "embedding_length");
  c["intermediate_size"] = file.integer(p + "feed_forward_length");
  c["num_hidden_layers"] = file.integer(p + "block_count");
  c["num_attention_heads"] = file.integer(p + "attention.head_count");
  if (file.has(p + "attention.head_count_kv")) {
    c["num_key_value_heads"] = file.integer(p + "attention.head_count_kv");
  }
  // The head size: the keys' length where the file states it, else the rotated dimensions
  // (llama.cpp writes rope.dimension_count for Llama), else hidden / heads. Different key and
  // rotated sizes would be a partial rotation, which the decoder does not serve.
  if (file.has(p + "attention.key_length")) {
    c["head_dim"] = file.integer(p + "attention.key_length");
  } else if (file.has(p + "rope.dimension_count")) {
    c["head_dim"] = file.integer(p + "rope.dimension_count");
  }
  if (file.has(p + "attention.key_length") && file.has(p + "rope.dimension_count") &&
      file.integer(p + "attention.key_length") != file.integer(p + "rope.dimension_count")) {
    throw invalid(file.path() + ": " + p + "rope.dimension_count (" +
                  std::to_string(file.integer(p + "rope.dimension_count")) +
                  ") differs from the key length (" +
                  std::to_string(file.integer(p + "attention.key_length")) +
                  "): a partial rotation, which is not served");
  }
  if (file.has(p + "attention.value_length") && file.has(p + "attention.key_length") &&
      file.integer(p + "attention.value_length") != file.integer(p + "attention.key_length")) {
    throw invalid(file.path() + ": " + p +
                  "attention.value_length differs from the key length, which is not served");
  }
  c["rms_norm_eps"] = file.number(p + "attention.layer_norm_rms_epsilon");
  c["rope_theta"] = file.has(p + "rope.freq_base") ? file.number(p + "rope.freq_base") : 10000.0;
  if (file.has(p + "context_length")) {
    c["max_position_embeddings"] = file.integer(p + "context_length");
  }
  if (file.has(p + "vocab_size")) {
    c["vocab_size"] = file.integer(p + "vocab_size");
  } else if (file.has("tokenizer.ggml.tokens")) {
    c["vocab_size"] = file.strings("tokenizer.ggml.tokens").size();
  } else {
    throw invalid(file.path() + ": neither " + p +
                  "vocab_size nor tokenizer.ggml.tokens gives the vocabulary's size");
  }
  // Without an output matrix the logits come from the embedding (transformers' reading too).
  c["tie_word_embeddings"] = file.contents().tensor_index.count("output.weight") == 0;
  if (file.contents().tensor_index.count("rope_freqs.weight") != 0) {
    throw invalid(file.path() +
                  ": rope_freqs.weight (rope factors stored as a tensor, as Llama 3.1's files "
                  "do) is not read yet");
  }
  if (file.has(p + "rope.scaling.type")) {
    const std::string type = file.text(p + "rope.scaling.type");
    if (type != "none") {
      nlohmann::ordered_json scaling;
      scaling["rope_type"] = type;
      if (file.has(p + "rope.scaling.factor")) {
        scaling["factor"] = file.number(p + "rope.scaling.factor");
      }
      if (file.has(p + "rope.scaling.original_context_length")) {
        scaling["original_max_position_embeddings"] =
            file.integer(p + "rope.scaling.original_context_length");
      }
      c["rope_scaling"] = scaling;
    }
  }
  c["torch_dtype"] = "float32";
  return c.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ModelConfig gguf_model_config(const GgufFile& file) {
  return parse_model_config(gguf_config_json(file), file.path() + " (its metadata as config.json)");
}

}  // namespace kvo::model
