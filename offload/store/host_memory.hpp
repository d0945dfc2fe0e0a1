// The whole plan against this machine's memory, checked before anything is allocated.
//
// On CUDA the pinned host store is the only host part of a plan (the device part is checked
// against the budget by plan_cache). On the host backend the "device" arena is host memory too:
// resident layers, the staging ring and the reserved regions (a model's weights and
// activations) add to the store, and keeping more layers resident only moves bytes from one to
// the other.
#pragma once

#include <cstdint>
#include <string>

#include "kvoffload/plan.hpp"
#include "kvoffload/types.hpp"

namespace kvo::offload {

// The fields of /proc/meminfo the check reads, in bytes (0 where one is missing).
struct MemInfo {
  std::uint64_t total = 0;      // MemTotal
  std::uint64_t available = 0;  // MemAvailable
  std::uint64_t committed = 0;  // Committed_AS
};
// Parses /proc/meminfo's text ("MemTotal:  24683784 kB" lines).
MemInfo parse_meminfo(const std::string& text);

// What this machine can give a new allocation: the larger of MemAvailable and MemTotal less
// Committed_AS. Each undercounts where the other does not: MemAvailable on a virtual machine
// whose memory is handed to it as it is used (it can start far below MemTotal while almost
// nothing is committed), MemTotal - Committed_AS where programs reserve more than they touch
// (it can be below zero). An allocation beyond what the system then gives still fails, and says
// so.
std::uint64_t available_bytes(const MemInfo& info);

// Throws kvo::Error(kOutOfMemory) giving what the plan needs, what is available and a remedy
// that works on `backend` (kCuda or kHost), when the plan's host memory exceeds `available`.
void require_host_memory(const CachePlan& plan, BackendKind backend, std::uint64_t available);

}  // namespace kvo::offload
