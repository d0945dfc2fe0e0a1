// OffloadedStaticCache's insides, shared by the files that implement it: cache.cpp (the
// protocol of a step, slots, stats) and cache_context.cpp (saved contexts). Not public.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "kvoffload/plan.hpp"
#include "offload/context/context_file.hpp"
#include "offload/store/device_arena.hpp"
#include "offload/store/host_memory.hpp"
#include "offload/store/host_store.hpp"
#include "offload/store/window_layers.hpp"
#include "prefetch/backend/backend.hpp"
#include "prefetch/backend/rate_probe.hpp"
#include "prefetch/ring/staging_ring.hpp"
#include "prefetch/ring/window_layers.hpp"

namespace kvo {
namespace {

inline Error protocol(const std::string& what) {
  return Error(ErrorCode::kProtocol, what);
}
inline Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

}  // namespace

// One slot's rows as a saved context sees them: streamed layers in the host store, resident
// layers in the device arena.
class __attribute__((visibility("hidden"))) CacheSlotRows : public offload::SlotRows {
 public:
  CacheSlotRows(prefetch::Backend& backend, offload::HostStore& store, offload::DeviceArena& arena,
                const CachePlan& plan, int slot)
      : backend_(backend), store_(store), arena_(arena), plan_(plan), slot_(slot) {}

  std::byte* host_rows(int layer, int kv) override {
    if (layer < plan_.resident_layers) return nullptr;
    const int streamed = layer - plan_.resident_layers;
    return kv == 0 ? store_.k(streamed, slot_) : store_.v(streamed, slot_);
  }
  void copy_from_device(int layer, int kv, std::size_t offset, std::size_t bytes,
                        void* host) override {
    backend_.copy_sync(host, device_rows(layer, kv) + offset, bytes);
  }
  void copy_to_device(int layer, int kv, std::size_t offset, std::size_t bytes,
                      const void* host) override {
    backend_.copy_sync(device_rows(layer, kv) + offset, host, bytes);
  }
  // A resident layer's rows of the slot, in the device arena.
  std::byte* device_rows(int layer, int kv) const {
    const KvLayout& l = plan_.layout;
    return arena_.resident_layer(layer) +
           (kv == 0 ? l.k_offset(slot_, 0) : l.v_begin() + l.v_offset(slot_, 0));
  }

 private:
  prefetch::Backend& backend_;
  offload::HostStore& store_;
  offload::DeviceArena& arena_;
  const CachePlan& plan_;
  int slot_;
};

// Hidden: the library exports the class, not its insides.
struct __attribute__((visibility("hidden"))) OffloadedStaticCache::Impl {
  explicit Impl(const CacheConfig& cfg) : config(cfg) {
    validate(config);
    backend = prefetch::make_backend(config);
    std::uint64_t budget = config.device_budget;
    if (budget == 0) {
      budget = backend->default_budget();
      if (budget == 0 && backend->kind() == BackendKind::kCuda) {
        throw Error(ErrorCode::kOutOfMemory,
                    "the GPU has no memory free beyond the headroom kept for cuBLAS, kernel "
                    "modules and the caller's tensors (max(1 GiB, 5% of its memory)); free "
                    "memory on the device or set a budget explicitly");
      }
    }
    plan = plan_cache(config, budget);
    // The full layers are planned, stored and streamed as a cache of their own; the window
    // layers' buffers are a region of its arena.
    windows = offload::plan_windows(config);
    // A node's ranks share its memory: each checks its store against its share.
    const std::uint64_t node = config.shard.node_available_bytes > 0
                                   ? config.shard.node_available_bytes
                                   : host_available_bytes();
    plan.host_share_bytes = node / static_cast<std::uint64_t>(config.shard.ranks_per_node);
    offload::require_host_memory(plan, backend->kind(), plan.host_share_bytes);
    store = std::make_unique<offload::HostStore>(*backend, plan);
    arena = std::make_unique<offload::DeviceArena>(*backend, plan, windows.full.reserved);
    lengths.assign(static_cast<std::size_t>(config.slots), 0);
    if (plan.streamed_layers > 0) {
      ring =
          std::make_unique<prefetch::StagingRing>(*backend, *store, *arena, plan, lengths.data());
    }
    window_layers = std::make_unique<prefetch::WindowLayers>(
        *backend, windows, windows.windows.empty() ? nullptr : arena->reserved(kWindowRegion),
        config.slots);
    for (int l = 0; l < config.layers; ++l) {
      released.push_back(on_device(l) ? prefetch::Event(*backend) : prefetch::Event());
    }
    new_tokens.assign(static_cast<std::size_t>(config.slots), 0);
    appended.assign(static_cast<std::size_t>(config.slots), 0);
    split.assign(static_cast<std::size_t>(config.slots), 0);
    next_split.assign(static_cast<std::size_t>(config.slots), 0);
    plan_split();
  }

  // begin_step, with each slot's split row given (nullptr: planned by config.split).
  void open_step(const std::vector<std::int32_t>& counts, const std::vector<std::int32_t>* given);

  // CachePlan's split fields; under kAuto the rates a config leaves 0 are measured (only when
  // something is streamed: nothing else splits).
  void plan_split() {
    SplitOptions& o = config.split;
    plan.split = o.mode;
    if (o.mode == SplitMode::kAuto && plan.streamed_layers > 0 &&
        (o.h2d_bytes_per_s == 0 || o.host_bytes_per_s == 0)) {
      const prefetch::SplitRates rates = prefetch::probe_split_rates(
          *backend, store->k(0, 0), arena->staging_buffer(0), plan.layer_bytes,
          o.h2d_bytes_per_s == 0, o.host_bytes_per_s == 0);
      if (o.h2d_bytes_per_s == 0) o.h2d_bytes_per_s = rates.h2d_bytes_per_s;
      if (o.host_bytes_per_s == 0) o.host_bytes_per_s = rates.host_bytes_per_s;
      plan.split_probe_s = rates.seconds;
    }
    if (o.mode == SplitMode::kAuto) {
      plan.split_h2d_bytes_per_s = o.h2d_bytes_per_s;
      plan.split_host_bytes_per_s = o.host_bytes_per_s;
    }
  }

  // The caller's streams may still read or append to the arena: let them finish before anything
  // is freed, then destroy in reverse order of construction.
  ~Impl() {
    try {
      if (backend) backend->synchronize_all();
    } catch (...) {
      // A destructor has no caller to report to; freeing goes on regardless.
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void check_slot(int slot) const {
    if (slot < 0 || slot >= config.slots) {
      throw invalid("slot " + std::to_string(slot) + " is out of range (the cache has " +
                    std::to_string(config.slots) + " slots)");
    }
  }
  void check_between_steps(const char* call) const {
    if (in_step) {
      throw protocol(std::string(call) +
                     " is only allowed between steps (call end_step or "
                     "abort_step first)");
    }
  }
  void check_held(int layer, const char* call) const {
    if (!in_step) throw protocol(std::string(call) + " outside a step (call begin_step first)");
    if (held_layer < 0) {
      throw protocol(std::string(call) + " on layer " + std::to_string(layer) +
                     " without acquire (acquire the layer first)");
    }
    if (layer != held_layer) {
      throw protocol(std::string(call) + " on layer " + std::to_string(layer) + " while layer " +
                     std::to_string(held_layer) + " is the one acquired");
    }
  }
  // Of a layer of the config: its index among the full layers (-1 for a window layer), and
  // whether it is a full layer kept on the device.
  int full(int layer) const { return windows.full_index[static_cast<std::size_t>(layer)]; }
  int window(int layer) const { return windows.window_index[static_cast<std::size_t>(layer)]; }
  // A streamed layer's index in the ring and the host store.
  int streamed(int layer) const { return full(layer) - plan.resident_layers; }
  bool is_resident(int layer) const {
    const int f = full(layer);
    return f >= 0 && f < plan.resident_layers;
  }
  // Kept on the device, never through the ring: a resident full layer or a window layer.
  bool on_device(int layer) const { return window(layer) >= 0 || is_resident(layer); }
  void check_no_windows(const char* call) const {
    if (!windows.windows.empty()) {
      throw invalid(std::string(call) +
                    ": saved contexts hold every layer's rows from the "
                    "first; this cache keeps " +
                    std::to_string(windows.windows.size()) +
                    " window layers (their last rows alone), which they do not hold yet");
    }
  }
  void check_slots(const std::vector<int>& slots, const char* call) const {
    check_between_steps(call);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      check_slot(slots[i]);
      for (std::size_t j = 0; j < i; ++j) {
        if (slots[j] == slots[i]) {
          throw invalid(std::string(call) + ": slot " + std::to_string(slots[i]) +
                        " is named twice");
        }
      }
    }
  }
  // The shard line this cache's saved contexts start their model text with (or none).
  std::string held() const {
    return offload::shard_line(config.shard.kv_head_begin, config.kv_heads,
                               config.shard.model_kv_heads);
  }
  offload::ContextShape context_shape() const {
    offload::ContextShape shape{config.layers,  config.kv_heads, config.head_dim,
                                config.max_seq, config.dtype,    plan.row_bytes};
    shape.v_head_dim = plan.layout.v_head_dim;
    shape.v_row_bytes = plan.layout.v_row_bytes;
    return shape;
  }
  // Saving reads rows that write-backs and the callers' kernels may still be writing; loading
  // overwrites rows that prefetches may still be reading.
  void quiesce() const { backend->synchronize_all(); }
  void save(const std::vector<int>& slots, offload::ByteSink& sink,
            const std::vector<SlotContext>& contexts, const char* call);
  std::vector<SlotContext> load(const std::vector<int>& slots, offload::ByteSource& source,
                                const std::string& model, const std::string& what,
                                bool whole_input);
  std::byte* layer_base(int layer) const {
    if (window(layer) >= 0) return window_layers->slot_rows(window(layer), 0, 0);
    return is_resident(layer) ? arena->resident_layer(full(layer)) : held_buffer;
  }

  CacheConfig config;
  CachePlan plan;
  // Declared in construction order; destroyed in reverse (the ring drains first).
  std::unique_ptr<prefetch::Backend> backend;
  std::unique_ptr<offload::HostStore> store;
  std::unique_ptr<offload::DeviceArena> arena;
  // [slots]: committed rows of each slot, the same for every layer. Sized once: the ring reads
  // it through a pointer.
  std::vector<std::int32_t> lengths;
  std::unique_ptr<prefetch::StagingRing> ring;
  // Per layer kept on the device (on_device; none for a streamed one): recorded at release on
  // the caller's stream, waited at acquire, so a step on another stream starts after the
  // previous one's work on the layer (as the ring's events do for streamed layers).
  std::vector<prefetch::Event> released;
  // The window layers (CacheConfig::layer_windows): where each lies, and their rows.
  offload::WindowPlan windows;
  std::unique_ptr<prefetch::WindowLayers> window_layers;

  bool in_step = false;
  int next_layer = 0;
  int held_layer = -1;
  std::byte* held_buffer = nullptr;
  std::uint64_t reorder_bytes = 0;
  std::vector<std::int32_t> new_tokens;  // [slots] of the open step
  // Split attention: each slot's split row in the open step, and the guess the prefetches for
  // the next step were issued with; `splits`: whether any slot of the open step splits.
  std::vector<std::int32_t> split;
  std::vector<std::int32_t> next_split;
  bool splits = false;
  std::vector<std::int32_t> appended;  // [slots] rows appended to the held layer
  std::uint64_t steps = 0;
};

}  // namespace kvo
