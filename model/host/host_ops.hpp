// The host path: every operation on the CPU with f32 activations and f32 accumulation, computing
// directly on the host backend's "device" memory. The reference the CUDA path is tested against.
//
// One thread pool runs it all (OpsShape::threads threads): GEMMs through OpenBLAS in tiles
// (model/host/host_linear.hpp), attention from the cache's rows in place
// (model/host/host_attention.hpp), and the elementwise work in blocks of rows. Work is split by
// shape, not by thread count, so a given input gives the same bits on every run; see each part for
// what else holds.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/decoder/ops.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/host_linear.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {

class HostOps final : public Ops {
 public:
  // workspace: `workspace_bytes` bytes, 64-byte aligned, at least HostWorkspaceLayout(shape).bytes,
  // that the ops keep their scratch in for their lifetime (the decoder's plan reserves it);
  // nullptr: a region of their own.
  explicit HostOps(const OpsShape& shape, void* workspace = nullptr,
                   std::uint64_t workspace_bytes = 0);

  void synchronize() override {}
  void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                      void* dst) override;
  void sample(const float* logits, int n, const SampleRows& rows, const SamplingParams& params,
              std::uint64_t seed, std::int32_t* tokens) override;

  void embed(const std::int32_t* tokens, int n, WeightRef table, float* out) override;
  void rms_norm(const float* x, int n, int width, const void* weight, float* out) override;
  void linear(const float* x, int n, int in, WeightRef w, const void* bias, int out, float* y,
              bool accumulate) override;
  void rope(float* q, float* k, int n, const std::int32_t* positions, int first_position,
            bool local) override;
  void to_cache_rows(const float* x, int n, void* out) override;
  void attention_prefill(const float* q, int n, int slot, int first_position, int window,
                         const LayerView& view, float* out) override;
  void attention_decode(const float* q, int n, const DecodeRows& rows, int window,
                        const LayerView& view, float* out) override;
  void attention_decode_split(const float* q, int n, const DecodeRows& rows, int window,
                              const LayerView& view, float* out) override;
  void gated_activation(float* gate, const float* up, std::int64_t count) override;
  void add(float* x, const float* y, std::int64_t count, float scale) override;
  void scale(float* x, std::int64_t count, float factor) override;
  void soft_cap(float* x, std::int64_t count, float cap) override;

  int threads() const { return pool_.threads(); }

 private:
  OpsShape shape_;
  DType elem_;
  float norm_offset_;  // the family's, looked up once
  ThreadPool pool_;
  std::unique_ptr<HostRegion> own_;  // the region without a given workspace
  HostWorkspaceLayout layout_;
  HostLinear linear_;
  DType kv_elem_;  // the cache's rows
  HostAttention attention_;
  // Split attention's scratch: the host part's output and both parts' log-sum-exps.
  std::vector<float> host_out_;
  std::vector<float> lse_, host_lse_;
};

}  // namespace kvo::model
