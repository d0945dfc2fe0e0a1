// HostStore: the full-length, statically allocated K and V of every streamed layer, in host
// memory (pinned on CUDA).
//
// One allocation: [streamed layer][K|V][slot][token][row], each layer laid out by the plan's
// KvLayout (the one of the staging buffers), so a slot's valid prefix is one contiguous range
// and staging a layer is one copy per slot per tensor. How many rows of a slot are valid is the
// cache's business, not the store's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvoffload/plan.hpp"
#include "offload/store/memory.hpp"

namespace kvo::offload {

class HostStore {
 public:
  // Allocates plan.host_bytes; allocation failures name their size. The cache checks the plan
  // against available memory first (offload/store/host_memory.hpp).
  HostStore(MemoryResource& memory, const CachePlan& plan);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  // `streamed` indexes the streamed layers, 0 for the first one after the resident layers.
  std::byte* k(int streamed, int slot) const { return layer(streamed) + layout_.k_offset(slot, 0); }
  std::byte* v(int streamed, int slot) const {
    return layer(streamed) + layout_.v_begin() + layout_.v_offset(slot, 0);
  }
  std::size_t bytes() const { return bytes_; }
  std::uint64_t row_bytes() const { return layout_.k_row_bytes; }
  const KvLayout& layout() const { return layout_; }
  int slots() const { return layout_.slots; }
  int max_seq() const { return layout_.max_seq; }

 private:
  std::byte* layer(int streamed) const {
    return base_ + static_cast<std::size_t>(streamed) * layout_.layer_bytes();
  }

  MemoryResource& memory_;
  KvLayout layout_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace kvo::offload
