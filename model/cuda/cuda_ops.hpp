// The CUDA path's entry points. Built only with CUDA (KVO_WITH_CUDA); without it they throw
// kvo::Error(kDevice), and the decoder never calls them on the host backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/checkpoint/weights.hpp"
#include "model/decoder/ops.hpp"
#include "model/decoder/sampler.hpp"

namespace kvo::model {

// Ops on `stream` (a cudaStream_t), using `workspace` [WorkspaceLayout(...).bytes] of
// model/decoder/memory_plan.hpp: the cuBLAS workspace, the split-sequence partials of decode
// attention, the key-block scratch of prefill attention, and the rows of device sampling.
std::unique_ptr<Ops> make_cuda_ops(const OpsShape& shape, void* stream, void* workspace);

// Bytes in use on the current device (total - free, cudaMemGetInfo); 0 without CUDA.
std::uint64_t cuda_device_bytes_in_use();
// The budget a cache left at 0 gets on the current device now (default_device_budget of its
// free and total memory); 0 without CUDA.
std::uint64_t cuda_default_budget();

}  // namespace kvo::model
