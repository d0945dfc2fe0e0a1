#include "offload/store/host_store.hpp"

namespace kvo::offload {

HostStore::HostStore(MemoryResource& memory, const CachePlan& plan)
    : memory_(memory), layout_(plan.layout), bytes_(plan.host_bytes) {
  if (bytes_ == 0) return;
  base_ = static_cast<std::byte*>(memory_.alloc_host(bytes_));
}

HostStore::~HostStore() {
  memory_.free_host(base_);
}

}  // namespace kvo::offload
