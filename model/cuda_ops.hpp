// The CUDA path's entry points. Built only with CUDA (KVO_WITH_CUDA); without it they throw
// kvo::Error(kDevice), and the decoder never calls them on the host backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/ops.hpp"
#include "model/sampler.hpp"
#include "model/weights.hpp"

namespace kvo::model {

// Ops on `stream` (a cudaStream_t), using `workspace` [WorkspaceLayout(...).bytes] of
// model/memory_plan.hpp: the cuBLAS workspace, the split-sequence partials of decode attention,
// the key-block scratch of prefill attention, and the rows of device sampling.
std::unique_ptr<Ops> make_cuda_ops(const OpsShape& shape, void* stream, void* workspace);

// host_tokens [n] = the tokens sampled from logits [n][vocab] (device) on `stream`, row i for
// slot host_rows[i] and draw host_rows[n + i] (host_rows [2][n], host), by the rule of
// sample_token: the same tokens as Sampler, only the ids come back. Uses the `sampling` part of
// `workspace` (as make_cuda_ops's); waits for the stream. REQUIRES: n <= shape.max_decode_rows.
void sample_on_device(const OpsShape& shape, void* workspace, const float* logits, int n,
                      const std::int32_t* host_rows, const SamplingParams& params,
                      std::uint64_t seed, std::int32_t* host_tokens, void* stream);

// Draws the synthetic values of `entry` on the device straight into `dst`, on `stream`.
void fill_synthetic_on_device(const WeightLayout& layout, const WeightEntry& entry,
                              std::uint64_t seed, void* dst, void* stream);

// Bytes in use on the current device (total - free, cudaMemGetInfo); 0 without CUDA.
std::uint64_t cuda_device_bytes_in_use();

}  // namespace kvo::model
