// The window layers of a config (CacheConfig::layer_windows): which layers they are, where each
// one's buffer lies in the "kv windows" region, and the config of the full layers alone, which
// the plan, the arena, the host store and the ring are made from.
#pragma once

#include <cstdint>
#include <vector>

#include "kvoffload/config.hpp"
#include "kvoffload/plan.hpp"

namespace kvo::offload {

struct WindowPlan {
  // The full layers alone, the window buffers a reserved region (kWindowRegion) after the
  // caller's.
  CacheConfig full;
  std::vector<int> full_index;    // [layers]: the layer's index among full layers, or -1
  std::vector<int> window_index;  // [layers]: its index among window layers, or -1
  struct Window {
    int layer = 0;
    int window = 0;            // keys
    KvLayout layout;           // the cache's, with max_seq = the buffer's rows
    std::uint64_t offset = 0;  // of its K in the region; V at + layout.v_begin()
  };
  std::vector<Window> windows;
  std::uint64_t bytes = 0;  // the region
};

// REQUIRES: validate(config) passes.
WindowPlan plan_windows(const CacheConfig& config);

}  // namespace kvo::offload
