// A cache that moves bytes the way Hugging Face transformers' offloaded static cache does, so
// that its cost is measured in the same binary and run as ours:
//   - layer 0 stays on the device; every other layer is copied in whole (all slots, the full
//     max_cache_len, not the valid prefix) into one of two device buffers, one layer ahead;
//   - the new rows of each layer go to the host synchronously, before the layer computes.
// It computes nothing and keeps the same per-layer call shape as OffloadedStaticCache.
#pragma once

#include <cstdint>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "prefetch/backend/backend.hpp"

namespace kvo::bench {

class HfLikeOffloadedCache {
 public:
  HfLikeOffloadedCache(prefetch::Backend& backend, const CacheConfig& config)
      : backend_(backend), config_(config) {
    row_bytes_ =
        static_cast<std::size_t>(config.kv_heads) * config.head_dim * dtype_size(config.dtype);
    tensor_bytes_ = static_cast<std::size_t>(config.slots) * config.max_seq * row_bytes_;
    host_ = static_cast<std::uint8_t*>(
        backend_.alloc_host(2 * tensor_bytes_ * static_cast<std::size_t>(config.layers)));
    // Layer 0 plus two staging buffers, each K and V.
    device_ = static_cast<std::uint8_t*>(backend_.alloc_device(3 * 2 * tensor_bytes_));
    prefetch_stream_ = backend_.create_stream();
    for (auto& e : prefetched_) e = backend_.create_event();
    lengths_.assign(static_cast<std::size_t>(config.slots), 0);
  }
  ~HfLikeOffloadedCache() {
    backend_.synchronize_stream(prefetch_stream_);
    for (auto& e : prefetched_) backend_.destroy_event(e);
    backend_.destroy_stream(prefetch_stream_);
    backend_.free_device(device_);
    backend_.free_host(host_);
  }
  HfLikeOffloadedCache(const HfLikeOffloadedCache&) = delete;
  HfLikeOffloadedCache& operator=(const HfLikeOffloadedCache&) = delete;

  // One decode step of one token per slot; `rows` holds one K/V row per slot on the device.
  // Returns the bytes it moved.
  std::uint64_t decode_step(const std::uint8_t* rows, void* stream) {
    std::uint64_t moved = 0;
    for (int layer = 0; layer < config_.layers; ++layer) {
      std::uint8_t* buffer = layer_buffer(layer);
      if (layer > 0) backend_.wait(stream, prefetched_[layer % 2]);
      if (layer + 1 < config_.layers) moved += prefetch(layer + 1);  // the next layer, whole
      for (int s = 0; s < config_.slots; ++s) {
        const std::size_t at =
            (static_cast<std::size_t>(s) * config_.max_seq + lengths_[s]) * row_bytes_;
        for (int kv = 0; kv < 2; ++kv) {
          backend_.copy_async(buffer + kv * tensor_bytes_ + at, rows, row_bytes_, stream);
          // The new row goes to the host before anything else runs: a synchronous copy.
          backend_.synchronize_stream(stream);
          backend_.copy_sync(host_layer(layer) + kv * tensor_bytes_ + at,
                             buffer + kv * tensor_bytes_ + at, row_bytes_);
          moved += row_bytes_;
        }
      }
    }
    for (auto& length : lengths_) ++length;
    return moved;
  }

  void set_length(int length) { lengths_.assign(lengths_.size(), length); }
  std::uint64_t bytes_per_step_model() const {
    return static_cast<std::uint64_t>(config_.layers - 1) * 2 * tensor_bytes_ +
           static_cast<std::uint64_t>(config_.layers) * 2 * config_.slots * row_bytes_;
  }

 private:
  // Copies the whole max_cache_len of `layer` (K and V, every slot) into its staging buffer.
  std::uint64_t prefetch(int layer) {
    backend_.copy_async(layer_buffer(layer), host_layer(layer), 2 * tensor_bytes_,
                        prefetch_stream_);
    backend_.record(prefetched_[layer % 2], prefetch_stream_);
    return 2 * tensor_bytes_;
  }
  std::uint8_t* layer_buffer(int layer) const {
    return device_ + (layer == 0 ? 0 : 1 + layer % 2) * 2 * tensor_bytes_;
  }
  std::uint8_t* host_layer(int layer) const {
    return host_ + static_cast<std::size_t>(layer) * 2 * tensor_bytes_;
  }

  prefetch::Backend& backend_;
  CacheConfig config_;
  std::size_t row_bytes_ = 0;
  std::size_t tensor_bytes_ = 0;
  std::uint8_t* host_ = nullptr;
  std::uint8_t* device_ = nullptr;
  void* prefetch_stream_ = nullptr;
  void* prefetched_[2] = {nullptr, nullptr};
  std::vector<int> lengths_;
};

}  // namespace kvo::bench
