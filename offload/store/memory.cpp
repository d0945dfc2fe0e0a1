#include "offload/store/memory.hpp"

namespace kvo::offload {

void AllocationLedger::add(void* ptr, std::size_t bytes, Kind kind) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[ptr] = Entry{bytes, kind};
  if (kind == Kind::kHost) {
    counters_.host_bytes += bytes;
    return;
  }
  counters_.device_allocations += 1;
  counters_.device_bytes += bytes;
  if (counters_.device_bytes > counters_.device_peak_bytes) {
    counters_.device_peak_bytes = counters_.device_bytes;
  }
}

void AllocationLedger::remove(void* ptr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(ptr);
  if (it == entries_.end()) return;
  (it->second.kind == Kind::kHost ? counters_.host_bytes : counters_.device_bytes) -=
      it->second.bytes;
  entries_.erase(it);
}

MemoryCounters AllocationLedger::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace kvo::offload
