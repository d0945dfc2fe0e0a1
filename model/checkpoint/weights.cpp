#include "model/checkpoint/weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/common/numerics.hpp"
#include "model/families/family.hpp"

namespace kvo::model {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

ElementType type_of_ggml(std::uint32_t ggml) {
  ElementType type = ElementType::kF32;
  if (!element_type_of_ggml(ggml, &type)) {
    throw Error(ErrorCode::kInvalidArgument,
                "GGUF type " + std::to_string(ggml) + " is not one the model reads");
  }
  return type;
}

void check_weights_type(const WeightRef& w, DType weights, bool half_kept) {
  const bool kept = half_kept && widened_as_read(w.type, weights);
  if (!w.in_blocks() && w.type != element_type(weights) && !kept) {
    throw Error(ErrorCode::kInternal, std::string("a matrix of ") + traits(w.type).name +
                                          " where the model's weights are " + dtype_name(weights));
  }
}

std::size_t matrix_bytes(ElementType type, std::int64_t rows, std::int64_t in) {
  const ElementTraits t = traits(type);
  return static_cast<std::size_t>(rows * (in / t.block_elements) * t.block_bytes);
}

WeightLayout::WeightLayout(const ModelConfig& config, DType dtype,
                           const std::map<std::string, std::uint32_t>& kept)
    : config_(config), dtype_(dtype) {
  const std::int64_t h = config.hidden_size;
  const std::vector<LayerTensor> layer = layer_tensors(config);
  add("model.embed_tokens.weight", {config.vocab_size, h}, WeightKind::kMatrix, kept);
  for (int l = 0; l < config.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const LayerTensor& t : layer) add(p + t.name, t.shape, t.kind, kept);
  }
  add("model.norm.weight", {h}, WeightKind::kNorm, kept);
  if (!config.tie_word_embeddings) {
    add("lm_head.weight", {config.vocab_size, h}, WeightKind::kMatrix, kept);
  }
}

std::vector<LayerTensor> WeightLayout::layer_tensors(const ModelConfig& config) {
  return family_of_architecture(config.architecture, "the model").layer_tensors(config);
}

void WeightLayout::add(const std::string& name, std::vector<std::int64_t> shape, WeightKind kind,
                       const std::map<std::string, std::uint32_t>& kept) {
  WeightEntry e;
  e.name = name;
  e.type = element_type(dtype_);
  e.elements = 1;
  for (auto d : shape) e.elements *= d;
  e.shape = std::move(shape);
  e.kind = kind;
  e.stream = entries_.size();
  e.scale = kind == WeightKind::kMatrix
                ? static_cast<float>(std::sqrt(3.0 / static_cast<double>(e.shape[1])))
                : 0.1f;
  if (const auto it = kept.find(name); it != kept.end() && kind == WeightKind::kMatrix) {
    e.type = type_of_ggml(it->second);
    has_blocks_ = has_blocks_ || e.in_blocks();
    has_other_types_ = has_other_types_ || e.type != element_type(dtype_);
  }
  e.offset = bytes_;
  bytes_ += (entry_bytes(e) + 255) / 256 * 256;
  entries_.push_back(std::move(e));
}

ModelWeights WeightLayout::bind(const void* region) const {
  const auto* base = static_cast<const std::byte*>(region);
  ModelWeights w;
  w.dtype = dtype_;
  w.layers.resize(static_cast<std::size_t>(config_.layers));
  const std::vector<LayerTensor> layer = layer_tensors(config_);
  // Entries come as the constructor added them: the embedding, each layer's tensors in the
  // family's order, the final norm, and the head unless it is tied.
  std::size_t e = 0;
  const auto matrix = [&](const WeightEntry& entry) {
    return WeightRef{base + entry.offset, entry.type};
  };
  w.embed = matrix(entries_[e++]);
  for (LayerWeights& weights : w.layers) {
    for (const LayerTensor& t : layer) {
      const WeightEntry& entry = entries_[e++];
      if (t.matrix != nullptr) {
        weights.*(t.matrix) = matrix(entry);
      } else {
        weights.*(t.vector) = base + entry.offset;
      }
    }
  }
  w.final_norm = base + entries_[e++].offset;
  w.lm_head = e < entries_.size() ? matrix(entries_[e]) : w.embed;
  return w;
}

float synthetic_value(const WeightEntry& entry, std::uint64_t seed, std::int64_t i) {
  const float u = seeded_uniform(seed, entry.stream, static_cast<std::uint64_t>(i));
  return entry.kind == WeightKind::kNorm ? 1.0f + entry.scale * u : entry.scale * u;
}

void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                    void* out) {
  fill_synthetic_range(layout, entry, seed, 0, entry.elements, out);
}

void fill_synthetic_range(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                          std::int64_t first, std::int64_t count, void* out) {
  const DType type = layout.dtype();
  for (std::int64_t i = 0; i < count; ++i) {
    store_elem(out, i, type, synthetic_value(entry, seed, first + i));
  }
}

void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count) {
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::int64_t>(i);
    store_elem(dst, index, to, load_elem(src, index, from));
  }
}

namespace {

// Layers the checkpoint holds: one more than the largest N of a "model.layers.N." tensor.
int checkpoint_layers(const Checkpoint& checkpoint) {
  static const std::string kPrefix = "model.layers.";
  long long layers = 0;
  for (const auto& [name, info] : checkpoint.tensors()) {
    (void)info;
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    const std::size_t digits = name.find_first_not_of("0123456789", kPrefix.size());
    if (digits == kPrefix.size() || digits > kPrefix.size() + 6 || digits == std::string::npos ||
        name[digits] != '.') {
      continue;
    }
    layers = std::max(layers, std::stoll(name.substr(kPrefix.size(), digits - kPrefix.size())) + 1);
  }
  return static_cast<int>(layers);
}

}  // namespace

void check_checkpoint(const WeightLayout& layout, const Checkpoint& checkpoint) {
  const int config_layers = layout.config().layers;
  const int held = checkpoint_layers(checkpoint);
  if (held != config_layers) {
    throw Error(
        ErrorCode::kInvalidArgument,
        checkpoint.dir() + ": config.json has num_hidden_layers " + std::to_string(config_layers) +
            " but the checkpoint holds " + std::to_string(held) + " layers" +
            (held > 0 ? " (model.layers.0 to model.layers." + std::to_string(held - 1) + ")" : ""));
  }
  for (const auto& e : layout.entries()) {
    const TensorInfo& t = checkpoint.tensor(e.name);
    if (!t.dtype_supported) {
      throw Error(ErrorCode::kInvalidArgument, t.file + ": tensor \"" + e.name + "\" has dtype " +
                                                   t.dtype_text + " (supported: F32, F16, BF16)");
    }
    if (t.shape != e.shape) {
      throw Error(ErrorCode::kInvalidArgument, t.file + ": tensor \"" + e.name + "\" has shape " +
                                                   shape_text(t.shape) + ", the config needs " +
                                                   shape_text(e.shape));
    }
  }
}

namespace {

// One Q8_0 block of x[32] with the scale taken from `amax`, as ggml's reference takes it.
void q8_0_block(const float* x, float amax, std::uint8_t* out) {
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::uint16_t half = 0;
  store_elem(&half, 0, DType::kF16, d);
  out[0] = static_cast<std::uint8_t>(half & 0xff);
  out[1] = static_cast<std::uint8_t>(half >> 8);
  for (int i = 0; i < 32; ++i) {
    out[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(x[i] * id)));
  }
}

float max_abs(const float* x, std::int64_t count) {
  float amax = 0;
  for (std::int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

}  // namespace

void quantize_q8_0(const float* x, std::int64_t count, std::uint8_t* out) {
  for (std::int64_t at = 0; at < count; at += 32, x += 32, out += 34) {
    q8_0_block(x, max_abs(x, 32), out);
  }
}

void quantize_int8_rows(const float* x, std::int64_t rows, std::int64_t cols, std::uint8_t* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float amax = max_abs(x, cols);
    for (std::int64_t at = 0; at < cols; at += 32, x += 32, out += 34) q8_0_block(x, amax, out);
  }
}

void quantize_q8_0_matrix(const float* x, std::int64_t rows, std::int64_t cols, Q8Scales scales,
                          std::uint8_t* out) {
  if (scales == Q8Scales::kPerRow) {
    quantize_int8_rows(x, rows, cols, out);
  } else {
    quantize_q8_0(x, rows * cols, out);
  }
}

void load_checkpoint(const WeightLayout& layout, const Checkpoint& checkpoint,
                     const UploadFn& upload, const ProgressFn& progress, Q8Scales scales) {
  check_checkpoint(layout, checkpoint);
  std::vector<std::byte> staging;
  std::vector<float> values;
  const auto total = static_cast<std::int64_t>(layout.entries().size());
  std::int64_t done = 0;
  for (const auto& e : layout.entries()) {
    const TensorInfo& t = checkpoint.tensor(e.name);
    const std::size_t bytes = layout.entry_bytes(e);
    staging.resize(bytes);
    if (e.type == ElementType::kQ8_0) {  // quantized at load (DecoderOptions::weight_format)
      values.resize(static_cast<std::size_t>(e.elements));
      convert_elements(t.data, t.dtype, values.data(), DType::kF32, values.size());
      // A scale cannot hold an infinity or a NaN: refused, naming where, before anything is built
      // from it.
      const auto bad =
          std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
      if (bad != values.end()) {
        throw Error(ErrorCode::kInvalidArgument, t.file + ": tensor \"" + e.name + "\" element " +
                                                     std::to_string(bad - values.begin()) + " is " +
                                                     std::to_string(*bad) +
                                                     ": weights quantized at load must be finite");
      }
      quantize_q8_0_matrix(values.data(), e.shape[0], e.shape[1], scales,
                           reinterpret_cast<std::uint8_t*>(staging.data()));
    } else {
      convert_elements(t.data, t.dtype, staging.data(), layout.dtype(),
                       static_cast<std::size_t>(e.elements));
    }
    upload(e.offset, staging.data(), bytes);
    if (progress) progress(++done, total);
  }
}

}  // namespace kvo::model
