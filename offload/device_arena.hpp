// DeviceArena: every device byte of a cache, allocated once from its CachePlan, carved into
// resident layers, staging buffers and the caller's reserved regions. Nothing is allocated
// after construction.
//
// Order in the one allocation: resident layers [0, R), staging buffers [0, D), reserved regions
// in config order. Each layer-sized buffer is K then V: [K|V][slot][token][kv_head][head_dim].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/plan.hpp"
#include "prefetch/backend.hpp"

namespace kvo::offload {

class DeviceArena {
 public:
  DeviceArena(prefetch::Backend& backend, const CachePlan& plan,
              const std::vector<ReservedRegion>& reserved);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // K of a layer-sized buffer; V follows at + tensor_bytes().
  std::byte* resident_layer(int layer) const { return layer_buffer(layer); }
  std::byte* staging_buffer(int index) const { return layer_buffer(resident_layers_ + index); }
  std::uint64_t tensor_bytes() const { return tensor_bytes_; }
  // Throws kvo::Error(kInvalidArgument) for a name the config did not reserve.
  std::byte* reserved(const std::string& name) const;
  std::size_t bytes() const { return bytes_; }

 private:
  std::byte* layer_buffer(int index) const {
    return base_ + static_cast<std::size_t>(index) * 2 * tensor_bytes_;
  }

  struct Region {
    std::string name;
    std::size_t offset;
  };
  prefetch::Backend& backend_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t tensor_bytes_ = 0;
  int resident_layers_ = 0;
  std::vector<Region> regions_;
};

}  // namespace kvo::offload
