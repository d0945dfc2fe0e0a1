// Where each weight of the decoder lives inside the one "weights" region of the device plan,
// and how it gets there: from a safetensors checkpoint (converted to the model dtype) or drawn
// from a seed (the same values on the host and on the GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/common/progress.hpp"
#include "offload/util/element_types.hpp"

namespace kvo::model {

class Checkpoint;
struct LayerTensor;  // model/families/family.hpp

// A matrix and its element type: the model dtype (every matrix of a safetensors checkpoint or a
// synthetic model), the blocks of a GGUF type (model/checkpoint/ggml_blocks.hpp: each row of
// `in` elements is in / block elements blocks, rows one after another), or on the host backend a
// GGUF file's f16 or bf16 matrix kept in its type in an f32 model (gguf_kept_matrices).
struct WeightRef {
  const void* data = nullptr;
  ElementType type = ElementType::kF32;
  bool in_blocks() const { return is_block_type(type); }
  std::uint32_t ggml() const { return traits(type).ggml; }  // its GGUF type's number
};

// The element type of ggml's type `ggml`; throws for a number the element types' table lacks.
ElementType type_of_ggml(std::uint32_t ggml);

// Whether a model of dtype `model` may keep a matrix of `type` as it is and widen it as read, with
// the bits of the matrix expanded: f16 and bf16 in an f32 model (a GGUF file's, on the host).
inline bool widened_as_read(ElementType type, DType model) {
  return model == DType::kF32 && (type == ElementType::kF16 || type == ElementType::kBF16);
}

// Throws kvo::Error(kInternal) when `w` is neither in GGUF blocks nor in the weights' dtype (nor,
// with `half_kept`, in f16 or bf16 in an f32 model: the host's kept matrices): an op must not read
// one dtype's bytes as another's.
void check_weights_type(const WeightRef& w, DType weights, bool half_kept = false);

// Bytes of `rows` rows of `in` elements of a matrix of element type `type`.
std::size_t matrix_bytes(ElementType type, std::int64_t rows, std::int64_t in);

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
  ElementType type = ElementType::kF32;  // the layout's dtype, or a matrix's kept GGUF type
  bool in_blocks() const { return is_block_type(type); }
};

// Pointers into the region, by role.
struct LayerWeights {
  const void* attn_norm = nullptr;  // [hidden]
  WeightRef wq;                     // [heads * head_dim][hidden]
  WeightRef wk;                     // [kv_heads * head_dim][hidden]
  WeightRef wv;                     // [kv_heads * head_dim][hidden]
  WeightRef wo;                     // [hidden][heads * head_dim]
  const void* bq = nullptr;         // [heads * head_dim] or null
  const void* bk = nullptr;
  const void* bv = nullptr;
  const void* bo = nullptr;        // [hidden] or null
  const void* q_norm = nullptr;    // [head_dim] or null: RMSNorm of each query head (Qwen3)
  const void* k_norm = nullptr;    // [head_dim] or null: and of each key head
  const void* mlp_norm = nullptr;  // [hidden]
  // Gemma: the norms of the attention's output and of the MLP's output, or null.
  const void* attn_post_norm = nullptr;  // [hidden]
  const void* mlp_post_norm = nullptr;   // [hidden]
  WeightRef w_gate;                      // [intermediate][hidden]
  WeightRef w_up;                        // [intermediate][hidden]
  WeightRef w_down;                      // [hidden][intermediate]
};

struct ModelWeights {
  DType dtype = DType::kF32;
  WeightRef embed;                   // [vocab][hidden]
  const void* final_norm = nullptr;  // [hidden]
  WeightRef lm_head;                 // [vocab][hidden]; == embed when tied
  std::vector<LayerWeights> layers;
};

class WeightLayout {
 public:
  // `kept`: the matrices kept in a GGUF type of their own (their names, as entries name them, and
  // ggml types: blocks, or f16 and bf16 in an f32 model; gguf_kept_matrices); every other tensor
  // is in `dtype`.
  WeightLayout(const ModelConfig& config, DType dtype,
               const std::map<std::string, std::uint32_t>& kept = {});

  const std::vector<WeightEntry>& entries() const { return entries_; }
  std::size_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  const ModelConfig& config() const { return config_; }
  std::size_t entry_bytes(const WeightEntry& e) const {
    return e.kind == WeightKind::kMatrix
               ? matrix_bytes(e.type, e.shape[0], e.shape[1])
               : static_cast<std::size_t>(e.elements) * element_bytes(dtype_);
  }
  // Whether any matrix is kept in blocks.
  bool has_blocks() const { return has_blocks_; }
  // Whether any matrix is in a type other than the dtype (blocks, or kept f16 or bf16): the ops
  // convert such a matrix's GEMM tiles into f32 panels.
  bool has_other_types() const { return has_other_types_; }
  ModelWeights bind(const void* region) const;

 private:
  // The family's tensors of one layer (model/families/family.hpp).
  static std::vector<LayerTensor> layer_tensors(const ModelConfig& config);
  void add(const std::string& name, std::vector<std::int64_t> shape, WeightKind kind,
           const std::map<std::string, std::uint32_t>& kept);
  ModelConfig config_;
  DType dtype_;
  std::vector<WeightEntry> entries_;
  std::size_t bytes_ = 0;
  bool has_blocks_ = false;
  bool has_other_types_ = false;
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
// How a matrix kept in Q8_0 blocks is quantized at load from f32 values.
enum class Q8Scales {
  kPerBlock,  // a scale per 32 weights (quantize_q8_0: weight format q8_0)
  kPerRow,    // one scale per output channel, in every block of the row (weight format int8)
};

void load_checkpoint(const WeightLayout& layout, const Checkpoint& checkpoint,
                     const UploadFn& upload, const ProgressFn& progress = {},
                     Q8Scales scales = Q8Scales::kPerBlock);

// out [count / 32 blocks] = x [count] in Q8_0 blocks, as ggml's reference quantizes them: per
// block d = max |x| / 127 (stored as f16), q = round(x / d) with 1/d taken before d is rounded.
// REQUIRES: count a multiple of 32.
void quantize_q8_0(const float* x, std::int64_t count, std::uint8_t* out);

// out [rows][cols / 32 blocks] = x [rows][cols] in Q8_0 blocks that share one scale per row (per
// output channel): d = max |row| / 127 as f16 in every block of the row, q = round(x / d) with
// 1/d taken before d is rounded, as quantize_q8_0 takes it per block. The bytes are Q8_0's, so
// every kernel that multiplies Q8_0 multiplies these. REQUIRES: cols a multiple of 32.
void quantize_int8_rows(const float* x, std::int64_t rows, std::int64_t cols, std::uint8_t* out);

// Quantizes the matrix `x` [rows][cols] into Q8_0 blocks by `scales`.
void quantize_q8_0_matrix(const float* x, std::int64_t rows, std::int64_t cols, Q8Scales scales,
                          std::uint8_t* out);

// Converts `count` elements between dtypes on the host.
void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

}  // namespace kvo::model
