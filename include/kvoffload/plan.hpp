// The device-memory plan: one source of truth for every byte a cache allocates.
#pragma once

#include <cstdint>

#include "kvoffload/config.hpp"

namespace kvo {

struct CachePlan {
  int layers = 0;
  int resident_layers = 0;  // effective: equals `layers` when nothing is streamed
  int streamed_layers = 0;  // layers - resident_layers
  int ring_depth = 0;       // staging buffers actually allocated (0 when nothing is streamed)

  std::uint64_t row_bytes = 0;     // one token of one tensor: kv_heads * head_dim * element size
  std::uint64_t tensor_bytes = 0;  // K (or V) of one layer: slots * max_seq rows, 256-aligned
  std::uint64_t layer_bytes = 0;   // K and V of one layer: 2 * tensor_bytes
  std::uint64_t resident_bytes = 0;
  std::uint64_t staging_bytes = 0;
  std::uint64_t reserved_bytes = 0;  // caller regions, each rounded up to 256 bytes
  std::uint64_t device_bytes = 0;    // resident + staging + reserved: one arena
  std::uint64_t host_bytes = 0;      // pinned host store: K and V of the streamed layers
  std::uint64_t budget = 0;          // the budget the plan was made against (0: none)
};

// Device memory a CUDA cache leaves to others when its budget is left at 0: cuBLAS's workspace,
// kernel modules loaded on first use, the caller's own tensors. max(1 GiB, 5% of the device).
std::uint64_t device_headroom(std::uint64_t total_bytes);
// The budget of such a cache: the device's free memory less device_headroom(total); 0 when the
// headroom takes it all.
std::uint64_t default_device_budget(std::uint64_t free_bytes, std::uint64_t total_bytes);

// Bytes the plan needs for a given resident-layer count (before the "all fit" promotion).
// REQUIRES: validate(config) passes.
std::uint64_t plan_device_bytes(const CacheConfig& config, int resident_layers);

// Turns a config and a device budget (0: unlimited) into a plan. With
// config.resident_layers == kAutoResidentLayers, keeps as many layers resident as fit.
// Throws kvo::Error(kOutOfMemory) naming the missing bytes when even the smallest plan, or the
// explicitly requested one, does not fit; kvo::Error(kInvalidArgument) for a bad config.
CachePlan plan_cache(const CacheConfig& config, std::uint64_t budget);

}  // namespace kvo
