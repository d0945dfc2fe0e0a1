#include "offload/host_memory.hpp"

#include <fstream>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/planner.hpp"
#include "offload/checked_math.hpp"

namespace kvo {

std::uint64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return UINT64_MAX;
}

namespace offload {

void require_host_memory(const CachePlan& plan, BackendKind backend, std::uint64_t available) {
  if (backend == BackendKind::kHost) {
    const std::uint64_t need =
        checked_add(plan.device_bytes, plan.host_bytes, "host bytes of the plan");
    if (need <= available) return;
    throw Error(
        ErrorCode::kOutOfMemory,
        "the plan needs " + format_bytes(need) + " of host memory (" +
            format_bytes(plan.device_bytes) +
            " for the device arena, which is host memory on the host backend, and " +
            format_bytes(plan.host_bytes) + " for the KV store) but this machine has " +
            format_bytes(available) + " available: missing " + format_bytes(need - available) +
            ". Lower max_seq or slots (on the host backend, keeping layers resident "
            "does not reduce it), or run on a GPU, where resident layers live in device memory");
  }
  if (plan.host_bytes <= available) return;
  throw Error(ErrorCode::kOutOfMemory,
              "the pinned host KV store needs " + format_bytes(plan.host_bytes) + " (" +
                  std::to_string(plan.streamed_layers) + " streamed layers) but this machine has " +
                  format_bytes(available) + " available: missing " +
                  format_bytes(plan.host_bytes - available) +
                  ". Keep more layers resident on the device (a larger budget or "
                  "resident_layers), or lower max_seq or slots");
}

}  // namespace offload
}  // namespace kvo
