// The host path: every operation in plain C++ on the CPU with f32 accumulation, computing
// directly on the host backend's "device" memory. The reference the CUDA path is tested against.
#pragma once

#include <vector>

#include "model/ops.hpp"

namespace kvo::model {

class HostOps final : public Ops {
 public:
  explicit HostOps(const OpsShape& shape);

  void synchronize() override {}
  void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                      void* dst) override;
  void sample(const float* logits, int n, const SampleRows& rows, const SamplingParams& params,
              std::uint64_t seed, std::int32_t* tokens) override;

  void embed(const std::int32_t* tokens, int n, const void* table, float* out) override;
  void rms_norm(const float* x, int n, const void* weight, float* out) override;
  void linear(const float* x, int n, int in, const void* w, const void* bias, int out, float* y,
              bool accumulate) override;
  void rope(float* q, float* k, int n, const std::int32_t* positions, int first_position) override;
  void to_cache_rows(const float* x, std::int64_t count, void* out) override;
  void attention_prefill(const float* q, int n, int slot, int first_position, const LayerView& view,
                         float* out) override;
  void attention_decode(const float* q, int n, const DecodeRows& rows, const LayerView& view,
                        float* out) override;
  void swiglu(float* gate, const float* up, std::int64_t count) override;

 private:
  // One query row over the keys [first, last] of `slot`: out [heads][head_dim] for q [heads][..].
  void attend(const float* q, int slot, int first, int last, const LayerView& view, float* out);

  OpsShape shape_;
  Elem elem_;
  // Host scratch, sized once: a weight row converted to f32, attention scores.
  std::vector<float> row_;
  std::vector<float> scores_;
  std::vector<float> sample_scratch_;
};

}  // namespace kvo::model
