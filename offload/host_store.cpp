#include "offload/host_store.hpp"

namespace kvo::offload {

HostStore::HostStore(prefetch::Backend& backend, const CachePlan& plan, int slots, int max_seq)
    : backend_(backend),
      bytes_(plan.host_bytes),
      row_bytes_(plan.row_bytes),
      tensor_bytes_(plan.tensor_bytes),
      layer_bytes_(plan.layer_bytes),
      max_seq_(max_seq),
      lengths_(static_cast<std::size_t>(slots), 0) {
  if (bytes_ == 0) return;
  base_ = static_cast<std::byte*>(backend_.alloc_host(bytes_));
}

HostStore::~HostStore() {
  backend_.free_host(base_);
}

void HostStore::truncate(int slot, int length) {
  if (length < this->length(slot)) set_length(slot, length);
}

}  // namespace kvo::offload
