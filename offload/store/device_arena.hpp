// DeviceArena: every device byte of a cache, allocated once from its CachePlan, carved into
// resident layers, staging buffers and the caller's reserved regions. Nothing is allocated
// after construction.
//
// Order in the one allocation: resident layers [0, R), staging buffers [0, D), reserved regions
// in config order. Each layer-sized buffer is laid out by the plan's KvLayout: K, then V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/plan.hpp"
#include "offload/store/memory.hpp"

namespace kvo::offload {

class DeviceArena {
 public:
  DeviceArena(MemoryResource& memory, const CachePlan& plan,
              const std::vector<ReservedRegion>& reserved);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // The start (K) of a layer-sized buffer; V at + layout().v_begin().
  std::byte* resident_layer(int layer) const { return layer_buffer(layer); }
  std::byte* staging_buffer(int index) const { return layer_buffer(resident_layers_ + index); }
  const KvLayout& layout() const { return layout_; }
  // Throws kvo::Error(kInvalidArgument) for a name the config did not reserve.
  std::byte* reserved(const std::string& name) const;
  std::size_t bytes() const { return bytes_; }

 private:
  std::byte* layer_buffer(int index) const {
    return base_ + static_cast<std::size_t>(index) * layout_.layer_bytes();
  }

  struct Region {
    std::string name;
    std::size_t offset;
  };
  MemoryResource& memory_;
  KvLayout layout_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  int resident_layers_ = 0;
  std::vector<Region> regions_;
};

}  // namespace kvo::offload
