// Where each weight of the decoder lives inside the one "weights" region of the device plan,
// and how it gets there: from a safetensors checkpoint (converted to the model dtype) or drawn
// from a seed (the same values on the host and on the GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/decoder/progress.hpp"

namespace kvo::model {

class Checkpoint;
struct LayerTensor;  // model/families/family.hpp

// How a synthetic tensor is drawn: matrices ~ U(-a, a) with std 1/sqrt(in) (so every layer
// changes the residual stream and the tokens depend on the prompt), norm weights
// 1 + U(-0.1, 0.1), biases U(-0.1, 0.1).
enum class WeightKind { kMatrix, kNorm, kBias };

struct WeightEntry {
  std::string name;                 // Hugging Face's name, e.g. model.layers.3.mlp.up_proj.weight
  std::vector<std::int64_t> shape;  // [out][in] for matrices, [n] for norms and biases
  WeightKind kind = WeightKind::kMatrix;
  std::uint64_t stream = 0;  // seed stream of synthetic values: the entry's index
  float scale = 1;           // synthetic values are scale * U(-1, 1) (+ 1 for norms)
  std::size_t offset = 0;    // bytes from the region start, 256-aligned
  std::int64_t elements = 0;
};

// Pointers into the region, by role.
struct LayerWeights {
  const void* attn_norm = nullptr;  // [hidden]
  const void* wq = nullptr;         // [heads * head_dim][hidden]
  const void* wk = nullptr;         // [kv_heads * head_dim][hidden]
  const void* wv = nullptr;         // [kv_heads * head_dim][hidden]
  const void* wo = nullptr;         // [hidden][heads * head_dim]
  const void* bq = nullptr;         // [heads * head_dim] or null
  const void* bk = nullptr;
  const void* bv = nullptr;
  const void* bo = nullptr;        // [hidden] or null
  const void* q_norm = nullptr;    // [head_dim] or null: RMSNorm of each query head (Qwen3)
  const void* k_norm = nullptr;    // [head_dim] or null: and of each key head
  const void* mlp_norm = nullptr;  // [hidden]
  const void* w_gate = nullptr;    // [intermediate][hidden]
  const void* w_up = nullptr;      // [intermediate][hidden]
  const void* w_down = nullptr;    // [hidden][intermediate]
};

struct ModelWeights {
  DType dtype = DType::kF32;
  const void* embed = nullptr;       // [vocab][hidden]
  const void* final_norm = nullptr;  // [hidden]
  const void* lm_head = nullptr;     // [vocab][hidden]; == embed when tied
  std::vector<LayerWeights> layers;
};

class WeightLayout {
 public:
  WeightLayout(const ModelConfig& config, DType dtype);

  const std::vector<WeightEntry>& entries() const { return entries_; }
  std::size_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  const ModelConfig& config() const { return config_; }
  std::size_t entry_bytes(const WeightEntry& e) const {
    return static_cast<std::size_t>(e.elements) * dtype_size(dtype_);
  }
  ModelWeights bind(const void* region) const;

 private:
  // The family's tensors of one layer (model/families/family.hpp).
  static std::vector<LayerTensor> layer_tensors(const ModelConfig& config);
  void add(const std::string& name, std::vector<std::int64_t> shape, WeightKind kind);
  ModelConfig config_;
  DType dtype_;
  std::vector<WeightEntry> entries_;
  std::size_t bytes_ = 0;
};

// Writes the synthetic values of `entry` in the layout's dtype to `out` (host memory).
void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                    void* out);
// The same for elements [first, first + count) of the entry: out[0] is element `first`.
void fill_synthetic_range(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                          std::int64_t first, std::int64_t count, void* out);
// The synthetic value of element i of an entry, before conversion to the model dtype.
float synthetic_value(const WeightEntry& entry, std::uint64_t seed, std::int64_t i);

// Copies `bytes` from host memory to `offset` of the weights region.
using UploadFn = std::function<void(std::size_t offset, const void* host, std::size_t bytes)>;

// Checks the config against the checkpoint's tensor table, reading no tensor data: the same
// number of layers, and every tensor the layout needs present with its shape and a supported
// dtype. Throws kvo::Error(kInvalidArgument) naming the first difference. The decoder calls it
// before it allocates anything.
void check_checkpoint(const WeightLayout& layout, const Checkpoint& checkpoint);

// Checks as check_checkpoint does, then converts every tensor the layout needs to the layout's
// dtype and uploads it; `progress` (if set) hears (tensors done, tensors) after each one.
void load_checkpoint(const WeightLayout& layout, const Checkpoint& checkpoint,
                     const UploadFn& upload, const ProgressFn& progress = {});

// Converts `count` elements between dtypes on the host.
void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

}  // namespace kvo::model
