// The whole plan against this machine's memory, checked before anything is allocated.
//
// On CUDA the pinned host store is the only host part of a plan (the device part is checked
// against the budget by plan_cache). On the host backend the "device" arena is host memory too:
// resident layers, the staging ring and the reserved regions (a model's weights and
// activations) add to the store, and keeping more layers resident only moves bytes from one to
// the other.
#pragma once

#include <cstdint>

#include "kvoffload/plan.hpp"
#include "kvoffload/types.hpp"

namespace kvo::offload {

// Throws kvo::Error(kOutOfMemory) giving what the plan needs, what is available and a remedy
// that works on `backend` (kCuda or kHost), when the plan's host memory exceeds `available`.
void require_host_memory(const CachePlan& plan, BackendKind backend, std::uint64_t available);

}  // namespace kvo::offload
