#include "model/checkpoint/weight_formats.hpp"

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/weights.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

// The block sizes are the format's table (gguf.hpp); the ids ggml's (ggml_blocks.hpp).
const GgmlType& type(std::uint32_t id) {
  return *ggml_type(id);
}

// The type a row of `row` elements can take: the K-quants need multiples of 256.
std::uint32_t fitting(std::uint32_t wanted, std::int64_t row) {
  if (row % type(wanted).block == 0) return wanted;
  std::uint32_t fallback = blocks::kF16;
  if (wanted == blocks::kQ4_K) fallback = blocks::kQ5_0;
  if (wanted == blocks::kQ5_K) fallback = blocks::kQ5_1;
  if (wanted == blocks::kQ6_K) fallback = blocks::kQ8_0;
  return row % type(fallback).block == 0 ? fallback : blocks::kF16;
}

// llama.cpp's "more bits" layers of a K_M recipe: the first and last eighth, every third between.
bool more_bits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::vector<std::string> weight_format_names() {
  return {"q8_0", "int8", "q4_k_m", "q5_k_m"};
}

std::uint64_t quantized_weight_bytes(const ModelConfig& config, const std::string& format) {
  std::uint32_t base = 0;
  if (format == "q8_0" || format == "int8") {  // int8: Q8_0 blocks sharing the row's scale
    base = blocks::kQ8_0;
  } else if (format == "q4_k_m") {
    base = blocks::kQ4_K;
  } else if (format == "q5_k_m") {
    base = blocks::kQ5_K;
  } else {
    throw Error(ErrorCode::kInvalidArgument, "weights \"" + printable(format) +
                                                 "\" is not a quantized format (q8_0, int8, "
                                                 "q4_k_m, q5_k_m)");
  }
  if (config.model_type == "phi3") {
    throw Error(ErrorCode::kInvalidArgument,
                "quantized weights are planned for Llama, Mistral, Qwen2 and Qwen3 layouts; "
                "Phi-3's fused projections are quantized by other rules");
  }
  const bool k_m = base != blocks::kQ8_0;
  const WeightLayout layout(config, DType::kF32);  // the tensors and their shapes
  std::uint64_t total = 0;
  for (const WeightEntry& e : layout.entries()) {
    std::uint64_t bytes = 0;
    if (e.kind != WeightKind::kMatrix) {
      bytes = static_cast<std::uint64_t>(e.elements) * 4;  // f32
    } else {
      std::uint32_t id = base;
      const bool embedding = e.name == "model.embed_tokens.weight";
      const bool output = e.name == "lm_head.weight" || (embedding && config.tie_word_embeddings);
      if (k_m && output) {
        id = blocks::kQ6_K;
      } else if (k_m && !embedding &&
                 (ends_with(e.name, "self_attn.v_proj.weight") ||
                  ends_with(e.name, "mlp.down_proj.weight"))) {
        const int layer = std::stoi(e.name.substr(std::string("model.layers.").size()));
        if (more_bits(layer, config.layers)) id = blocks::kQ6_K;
      }
      const GgmlType& t = type(fitting(id, e.shape[1]));  // a row: the input dimension
      bytes = static_cast<std::uint64_t>(e.elements) / t.block * t.block_bytes;
    }
    total += (bytes + 255) / 256 * 256;
  }
  return total;
}

void check_weight_format_source(const std::string& format, const std::string& checkpoint) {
  if (!format.empty() && !checkpoint.empty() && is_gguf_model(checkpoint)) {
    throw Error(ErrorCode::kInvalidArgument,
                "a GGUF file's weights come in its own blocks: " + printable(format) +
                    " quantizes a safetensors checkpoint or drawn weights at load");
  }
}

}  // namespace kvo::model
