#include "model/checkpoint/gguf_weights.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

struct Suffix {
  const char* hf;
  const char* gguf;
};
constexpr Suffix kLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Whether llama.cpp's converter interleaved the rows of each head of `hf_name`.
bool permuted(const GgufFile& file, const std::string& hf_name) {
  if (file.text("general.architecture") != "llama") return false;
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return hf_name.size() >= s.size() &&
           hf_name.compare(hf_name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with("self_attn.q_proj.weight") || ends_with("self_attn.q_proj.bias") ||
         ends_with("self_attn.k_proj.weight") || ends_with("self_attn.k_proj.bias");
}

// The file's row that holds the decoder's row `row` of a tensor whose rows were interleaved per
// head of `head_dim` rows (row half * head_dim/2 + i of a head went to row 2i + half).
std::int64_t file_row(std::int64_t row, std::int64_t head_dim) {
  const std::int64_t head = row / head_dim, within = row % head_dim, half_dim = head_dim / 2;
  return head * head_dim + 2 * (within % half_dim) + within / half_dim;
}

}  // namespace

std::string gguf_tensor_name(const std::string& hf_name) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  static const std::string kLayers = "model.layers.";
  if (starts_with(hf_name, kLayers)) {
    const std::size_t dot = hf_name.find('.', kLayers.size());
    if (dot != std::string::npos) {
      const std::string suffix = hf_name.substr(dot + 1);
      for (const Suffix& s : kLayerTensors) {
        if (suffix == s.hf) {
          return "blk." + hf_name.substr(kLayers.size(), dot - kLayers.size()) + "." + s.gguf;
        }
      }
    }
  }
  throw invalid("tensor " + printable(hf_name) + " has no GGUF name here");
}

void check_gguf_weights(const WeightLayout& layout, const GgufFile& file) {
  const int layers = layout.config().layers;
  for (const GgufTensor& t : file.contents().tensors) {
    if (!starts_with(t.name, "blk.")) continue;
    const std::size_t digits = t.name.find_first_not_of("0123456789", 4);
    if (digits == 4 || digits == std::string::npos || digits > 10 || t.name[digits] != '.')
      continue;
    if (std::stoll(t.name.substr(4, digits - 4)) >= layers) {
      throw invalid(file.path() + ": tensor " + printable(t.name) + " is past the " +
                    std::to_string(layers) + " layers of the model's metadata");
    }
  }
  for (const WeightEntry& e : layout.entries()) {
    const std::string name = gguf_tensor_name(e.name);
    if (file.contents().tensor_index.count(name) == 0) {
      throw invalid(file.path() + ": tensor " + name + " (" + e.name +
                    ") is missing, the model's metadata needs it");
    }
    const GgufTensor& t = file.tensor(name);
    std::vector<std::int64_t> shape(t.dims.rbegin(), t.dims.rend());
    if (shape != e.shape) {
      throw invalid(file.path() + ": tensor " + name + " has shape " + shape_text(shape) +
                    " (GGUF's dimensions reversed), the model's metadata needs " +
                    shape_text(e.shape));
    }
    if (blocks::block_elements(t.type->id) == 0) {
      throw invalid(file.path() + ": tensor " + name + " is " + t.type->name +
                    ", which is not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K "
                    "are)");
    }
    if (permuted(file, e.name) && layout.config().head_dim % 2 != 0) {
      throw invalid(file.path() + ": tensor " + name + " has heads of odd size " +
                    std::to_string(layout.config().head_dim) + ", which a rotation cannot pair");
    }
  }
}

std::map<std::string, std::uint32_t> gguf_kept_matrices(const WeightLayout& layout,
                                                        const GgufFile& file, bool half) {
  std::map<std::string, std::uint32_t> kept;
  for (const WeightEntry& e : layout.entries()) {
    if (e.kind != WeightKind::kMatrix) continue;
    const std::uint32_t type = file.tensor(gguf_tensor_name(e.name)).type->id;
    const ElementType element = type_of_ggml(type);
    if (is_block_type(element) || (half && widened_as_read(element, layout.dtype()))) {
      kept[e.name] = type;
    }
  }
  return kept;
}

void load_gguf_weights(const WeightLayout& layout, const GgufFile& file, const UploadFn& upload,
                       const ProgressFn& progress) {
  check_gguf_weights(layout, file);
  constexpr std::size_t kPieceFloats = std::size_t{1} << 20;  // 4 MiB of f32 per piece
  const DType dtype = layout.dtype();
  const std::size_t elem = dtype_size(dtype);
  std::vector<float> values;
  std::vector<std::byte> converted;
  const auto total = static_cast<std::int64_t>(layout.entries().size());
  std::int64_t done = 0;
  for (const WeightEntry& e : layout.entries()) {
    const GgufTensor& t = file.tensor(gguf_tensor_name(e.name));
    const std::int64_t row_length = t.dims[0];
    const std::int64_t rows = t.elements() / row_length;
    const auto per_block = static_cast<std::int64_t>(blocks::block_elements(t.type->id));
    const std::int64_t row_bytes = row_length / per_block * blocks::block_bytes(t.type->id);
    const bool interleaved = permuted(file, e.name);
    const std::int64_t piece_rows =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(kPieceFloats) / row_length);
    const auto source_row = [&](std::int64_t r) {
      return interleaved ? file_row(r, layout.config().head_dim) : r;
    };
    if (e.type != element_type(dtype)) {  // kept in the file's type: rows reordered, bytes kept
      const auto row_size = static_cast<std::size_t>(row_bytes);
      for (std::int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
        const std::int64_t n = std::min(piece_rows, rows - r0);
        converted.resize(static_cast<std::size_t>(n) * row_size);
        for (std::int64_t r = 0; r < n; ++r) {
          std::memcpy(converted.data() + static_cast<std::size_t>(r) * row_size,
                      t.data + source_row(r0 + r) * row_bytes, row_size);
        }
        upload(e.offset + static_cast<std::size_t>(r0) * row_size, converted.data(),
               converted.size());
      }
      if (progress) progress(++done, total);
      continue;
    }
    for (std::int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
      const std::int64_t n = std::min(piece_rows, rows - r0);
      values.resize(static_cast<std::size_t>(n * row_length));
      for (std::int64_t r = 0; r < n; ++r) {
        const auto* block =
            reinterpret_cast<const std::uint8_t*>(t.data) + source_row(r0 + r) * row_bytes;
        float* out = values.data() + r * row_length;
        for (std::int64_t at = 0; at < row_length; at += per_block) {
          blocks::dequantize_block(t.type->id, block, out + at);
          block += blocks::block_bytes(t.type->id);
        }
      }
      converted.resize(values.size() * elem);
      convert_elements(values.data(), DType::kF32, converted.data(), dtype, values.size());
      upload(e.offset + static_cast<std::size_t>(r0 * row_length) * elem, converted.data(),
             converted.size());
    }
    if (progress) progress(++done, total);
  }
}

}  // namespace kvo::model
