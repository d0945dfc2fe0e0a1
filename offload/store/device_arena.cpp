#include "offload/store/device_arena.hpp"

#include "kvoffload/error.hpp"
#include "offload/util/checked_math.hpp"

namespace kvo::offload {

DeviceArena::DeviceArena(MemoryResource& memory, const CachePlan& plan,
                         const std::vector<ReservedRegion>& reserved)
    : memory_(memory),
      layout_(plan.layout),
      bytes_(plan.device_bytes),
      resident_layers_(plan.resident_layers) {
  std::size_t offset = plan.resident_bytes + plan.staging_bytes;
  for (const ReservedRegion& region : reserved) {
    regions_.push_back({region.name, offset});
    offset += align_up(region.bytes, kDeviceAlignment);
  }
  if (offset != bytes_) throw Error(ErrorCode::kInternal, "device arena does not match its plan");
  if (bytes_ > 0) base_ = static_cast<std::byte*>(memory_.alloc_device(bytes_));
}

DeviceArena::~DeviceArena() {
  memory_.free_device(base_);
}

std::byte* DeviceArena::reserved(const std::string& name) const {
  for (const Region& region : regions_) {
    if (region.name == name) return base_ + region.offset;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "no device region named '" + name + "' was reserved in CacheConfig.reserved");
}

}  // namespace kvo::offload
