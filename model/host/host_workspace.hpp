// Every scratch buffer of the host path, laid out in one region: on the host backend the decoder's
// memory plan reserves it as the "workspace" (beside the weights and the activations), so what
// kvo-vram and the cache's plan count is what the host path uses, to the byte. The GEMMs' weight
// panels (f32, the bf16 kernel's, the q8 GEMM's repacked codes) and the 8-bit activation rows are
// here, sized for the widest input and the longest chunk; so are attention's per-thread tiles and
// decode partials, the norm weights, the rope angles and the sampler's.
//
// The layout depends on the shape (OpsShape, threads included) and on whether this CPU runs the
// bf16 GEMM (which needs a panel of 136 KiB where the others convert 128 rows of the widest input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/checkpoint/model_config.hpp"
#include "model/common/numerics.hpp"
#include "model/decoder/ops.hpp"
#include "offload/attend/decode_attention.hpp"

namespace kvo::model {

// `count` elements at `ptr` (a view into the workspace).
template <class T>
struct HostSpan {
  T* ptr = nullptr;
  std::size_t count = 0;
  T* data() const { return ptr; }
  std::size_t size() const { return count; }
  T* begin() const { return ptr; }
  T* end() const { return ptr + count; }
  T& operator[](std::size_t i) const { return ptr[i]; }
};

// Lays buffers out one after another from `base`, each at a 64-byte boundary; with no base it
// only counts. Throws kvo::Error(kInternal) past `limit` bytes.
class HostCarver {
 public:
  HostCarver() = default;
  HostCarver(std::byte* base, std::uint64_t limit) : base_(base), limit_(limit) {}

  template <class T>
  HostSpan<T> take(std::size_t count) {
    offset_ = (offset_ + 63) / 64 * 64;
    HostSpan<T> span{base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr, count};
    offset_ += count * sizeof(T);
    check();
    return span;
  }
  std::uint64_t bytes() const { return offset_; }

 private:
  void check() const;
  std::byte* base_ = nullptr;
  std::uint64_t limit_ = 0;
  std::uint64_t offset_ = 0;
};

// A region of its own, 64-byte aligned, for a part made outside the decoder (tests, benchmarks).
class HostRegion {
 public:
  explicit HostRegion(std::uint64_t bytes) : storage_(bytes + 64) {
    const auto at = reinterpret_cast<std::uintptr_t>(storage_.data());
    base_ = storage_.data() + ((64 - at % 64) % 64);
  }
  std::byte* data() const { return base_; }

 private:
  std::vector<std::byte> storage_;
  std::byte* base_ = nullptr;
};

// What `carve(HostCarver&)` lays out, in a region of its own made to fit and held by *own (a
// part made outside the decoder).
template <class Carve>
auto carve_own(std::unique_ptr<HostRegion>* own, Carve carve) {
  HostCarver count;
  carve(count);
  *own = std::make_unique<HostRegion>(count.bytes());
  HostCarver carver((*own)->data(), count.bytes());
  return carve(carver);
}

// HostLinear's buffers (model/host/host_linear.hpp).
struct HostLinearScratch {
  std::vector<HostSpan<float>> panels;  // [threads]: a GEMM tile's panel or one converted row
  HostSpan<std::uint8_t> q8_rows;       // [kGemmMinRows] decode rows quantized to 8 bits
  HostSpan<std::uint8_t> q8_gemm_rows;  // [max_rows] rows quantized for the q8 GEMM
  int q8_gemm_max_rows = 0;

  // type: the weights' dtype; max_in: the widest input; f32_gemm: bf16 weights multiply in f32;
  // blocks: some matrices in GGUF blocks or kept f16/bf16 in an f32 model (tiles widened into
  // panels of kGemmColBlock rows); max_rows: the most rows a call multiplies. The bf16
  // GEMM's panel is sized for it where this CPU runs it (uses_bf16_gemm), as HostLinear runs it.
  static HostLinearScratch carve(HostCarver& carver, int threads, DType type, int max_in,
                                 bool f32_gemm, bool blocks, bool q8_activations, int max_rows);
};

// HostAttention's buffers (model/host/host_attention.hpp).
struct HostAttentionScratch {
  struct Prefill {
    HostSpan<float> q, scores, out, k, v;  // [rows][d], [rows][key block], [rows][d], [block][d] x2
    HostSpan<SoftmaxState> state;          // [rows]
    HostSpan<int> first, last;             // [rows]: keys each row sees
  };
  std::vector<Prefill> prefill;  // [threads]
  attend::DecodeScratch decode;  // decode's buffers, for each of `threads`

  static HostAttentionScratch carve(HostCarver& carver, const ModelConfig& config, DType kv_type,
                                    int max_decode_rows, int threads);
};

// The widest input of any of the model's matrices.
int widest_input(const ModelConfig& config);

// The whole host path's workspace for `shape` (threads: shape.threads, at least 1).
struct HostWorkspaceLayout {
  HostLinearScratch linear;
  HostAttentionScratch attention;
  HostSpan<float> norm_weight;               // [max(hidden, q_dim, kv_dim)] as f32
  std::vector<HostSpan<float>> rope_angles;  // [threads][head_dim]: cos, sin of a position
  HostSpan<float> sample;                    // [2][vocab]
  std::uint64_t bytes = 0;                   // a multiple of 256, as the cache's regions are

  // base: the region (nullptr: only counts); limit: its bytes.
  HostWorkspaceLayout(const OpsShape& shape, std::byte* base = nullptr, std::uint64_t limit = 0);
};

}  // namespace kvo::model
