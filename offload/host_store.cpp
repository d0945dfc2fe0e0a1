#include "offload/host_store.hpp"

#include <fstream>
#include <string>

#include "kvoffload/error.hpp"

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

HostStore::HostStore(prefetch::Backend& backend, const CachePlan& plan, int slots, int max_seq)
    : backend_(backend),
      bytes_(plan.host_bytes),
      row_bytes_(plan.row_bytes),
      tensor_bytes_(plan.tensor_bytes),
      layer_bytes_(plan.layer_bytes),
      max_seq_(max_seq),
      lengths_(static_cast<std::size_t>(slots), 0) {
  if (bytes_ == 0) return;
  const std::uint64_t available = host_available_bytes();
  if (bytes_ > available) {
    throw Error(ErrorCode::kOutOfMemory,
                "the host KV store needs " + format_bytes(bytes_) + " but this machine has " +
                    format_bytes(available) +
                    " available: lower max_seq or slots, or keep more layers resident");
  }
  base_ = static_cast<std::byte*>(backend_.alloc_host(bytes_));
}

HostStore::~HostStore() {
  backend_.free_host(base_);
}

void HostStore::truncate(int slot, int length) {
  if (length < this->length(slot)) set_length(slot, length);
}

}  // namespace offload
}  // namespace kvo
