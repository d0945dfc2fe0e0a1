#include "offload/host_store.hpp"

#include <fstream>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/planner.hpp"

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

HostStore::HostStore(MemoryResource& memory, const CachePlan& plan)
    : memory_(memory), layout_(plan.layout), bytes_(plan.host_bytes) {
  if (bytes_ == 0) return;
  const std::uint64_t available = host_available_bytes();
  if (bytes_ > available) {
    throw Error(ErrorCode::kOutOfMemory,
                "the host KV store needs " + format_bytes(bytes_) + " but this machine has " +
                    format_bytes(available) +
                    " available: lower max_seq or slots, or keep more layers resident");
  }
  base_ = static_cast<std::byte*>(memory_.alloc_host(bytes_));
}

HostStore::~HostStore() {
  memory_.free_host(base_);
}

}  // namespace offload
}  // namespace kvo
