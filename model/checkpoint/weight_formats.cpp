#include "model/checkpoint/weight_formats.hpp"

#include "kvoffload/error.hpp"
#include "model/checkpoint/weights.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

struct Block {
  int elements;
  int bytes;
};
constexpr Block kQ8_0{32, 34};
constexpr Block kQ5_0{32, 22};
constexpr Block kQ5_1{32, 24};
constexpr Block kQ4_K{256, 144};
constexpr Block kQ5_K{256, 176};
constexpr Block kQ6_K{256, 210};
constexpr Block kF16{1, 2};

bool same(const Block& a, const Block& b) {
  return a.elements == b.elements && a.bytes == b.bytes;
}

// The block a row of `row` elements can take: the K-quants need multiples of 256.
Block fitting(Block wanted, std::int64_t row) {
  if (row % wanted.elements == 0) return wanted;
  Block fallback = kF16;
  if (same(wanted, kQ4_K)) fallback = kQ5_0;
  if (same(wanted, kQ5_K)) fallback = kQ5_1;
  if (same(wanted, kQ6_K)) fallback = kQ8_0;
  return row % fallback.elements == 0 ? fallback : kF16;
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
  return {"q8_0", "q4_k_m", "q5_k_m"};
}

std::uint64_t quantized_weight_bytes(const ModelConfig& config, const std::string& format) {
  Block base{};
  if (format == "q8_0") {
    base = kQ8_0;
  } else if (format == "q4_k_m") {
    base = kQ4_K;
  } else if (format == "q5_k_m") {
    base = kQ5_K;
  } else {
    throw Error(ErrorCode::kInvalidArgument, "weights \"" + printable(format) +
                                                 "\" is not a quantized format (q8_0, q4_k_m, "
                                                 "q5_k_m)");
  }
  if (config.model_type == "phi3") {
    throw Error(ErrorCode::kInvalidArgument,
                "quantized weights are planned for Llama, Mistral, Qwen2 and Qwen3 layouts; "
                "Phi-3's fused projections are quantized by other rules");
  }
  const bool k_m = !same(base, kQ8_0);
  const WeightLayout layout(config, DType::kF32);  // the tensors and their shapes
  std::uint64_t total = 0;
  for (const WeightEntry& e : layout.entries()) {
    std::uint64_t bytes = 0;
    if (e.kind != WeightKind::kMatrix) {
      bytes = static_cast<std::uint64_t>(e.elements) * 4;  // f32
    } else {
      Block block = base;
      const bool embedding = e.name == "model.embed_tokens.weight";
      const bool output = e.name == "lm_head.weight" || (embedding && config.tie_word_embeddings);
      if (k_m && output) {
        block = kQ6_K;
      } else if (k_m && !embedding &&
                 (ends_with(e.name, "self_attn.v_proj.weight") ||
                  ends_with(e.name, "mlp.down_proj.weight"))) {
        const int layer = std::stoi(e.name.substr(std::string("model.layers.").size()));
        if (more_bits(layer, config.layers)) block = kQ6_K;
      }
      block = fitting(block, e.shape[1]);  // a row: the input dimension
      bytes = static_cast<std::uint64_t>(e.elements) / static_cast<std::uint64_t>(block.elements) *
              static_cast<std::uint64_t>(block.bytes);
    }
    total += (bytes + 255) / 256 * 256;
  }
  return total;
}

}  // namespace kvo::model
