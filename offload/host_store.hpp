// HostStore: the full-length, statically allocated K and V of every streamed layer, in host
// memory (pinned on CUDA), and the committed length of every slot.
//
// Layout of the one allocation: [streamed layer][K|V][slot][token][kv_head][head_dim], each K or
// V block padded to 256 bytes. A slot's valid prefix [0, len) is one contiguous range, so
// staging a layer is one copy per slot per tensor and appending a token is one row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/plan.hpp"
#include "kvoffload/planner.hpp"
#include "prefetch/backend.hpp"

namespace kvo::offload {

class HostStore {
 public:
  // Allocates plan.host_bytes through the backend; allocation failures name their size. The cache
  // checks the plan against available memory first (offload/host_memory.hpp).
  HostStore(prefetch::Backend& backend, const CachePlan& plan, int slots, int max_seq);
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  // `streamed` indexes the streamed layers, 0 for the first one after the resident layers.
  std::byte* k(int streamed, int slot) const { return tensor(streamed, 0, slot); }
  std::byte* v(int streamed, int slot) const { return tensor(streamed, 1, slot); }
  std::size_t bytes() const { return bytes_; }
  std::uint64_t row_bytes() const { return row_bytes_; }

  int slots() const { return static_cast<int>(lengths_.size()); }
  int max_seq() const { return max_seq_; }
  // Committed rows of a slot (the same for every layer).
  int length(int slot) const { return lengths_[static_cast<std::size_t>(slot)]; }
  const std::int32_t* lengths() const { return lengths_.data(); }
  // REQUIRES: 0 <= length <= max_seq (checked by the caller).
  void set_length(int slot, int length) { lengths_[static_cast<std::size_t>(slot)] = length; }
  void reset(int slot) { set_length(slot, 0); }
  void truncate(int slot, int length);

 private:
  std::byte* tensor(int streamed, int kv, int slot) const {
    return base_ + static_cast<std::size_t>(streamed) * layer_bytes_ +
           static_cast<std::size_t>(kv) * tensor_bytes_ +
           static_cast<std::size_t>(slot) * static_cast<std::size_t>(max_seq_) * row_bytes_;
  }

  prefetch::Backend& backend_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t row_bytes_ = 0;
  std::uint64_t tensor_bytes_ = 0;
  std::uint64_t layer_bytes_ = 0;
  int max_seq_ = 0;
  std::vector<std::int32_t> lengths_;
};

}  // namespace kvo::offload
