// OffloadedStaticCache: checks the per-step protocol, then hands resident layers to the arena
// and streamed layers to the staging ring. Every check runs before any state changes, so a call
// that throws leaves the cache as it was.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "kvoffload/planner.hpp"
#include "offload/device_arena.hpp"
#include "offload/host_memory.hpp"
#include "offload/host_store.hpp"
#include "prefetch/backend.hpp"
#include "prefetch/staging_ring.hpp"

namespace kvo {

namespace {

Error protocol(const std::string& what) {
  return Error(ErrorCode::kProtocol, what);
}
Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

}  // namespace

struct OffloadedStaticCache::Impl {
  explicit Impl(const CacheConfig& cfg) : config(cfg) {
    validate(config);
    backend = prefetch::make_backend(config);
    std::uint64_t budget = config.device_budget;
    if (budget == 0 && backend->kind() == BackendKind::kCuda) budget = backend->device_free_bytes();
    plan = plan_cache(config, budget);
    offload::require_host_memory(plan, backend->kind(), host_available_bytes());
    store = std::make_unique<offload::HostStore>(*backend, plan, config.slots, config.max_seq);
    arena = std::make_unique<offload::DeviceArena>(*backend, plan, config.reserved);
    if (plan.streamed_layers > 0) {
      ring = std::make_unique<prefetch::StagingRing>(*backend, *store, *arena, plan);
    }
    resident_released.resize(static_cast<std::size_t>(plan.resident_layers));
    for (auto& event : resident_released) event = backend->create_event();
    new_tokens.assign(static_cast<std::size_t>(config.slots), 0);
    appended.assign(static_cast<std::size_t>(config.slots), 0);
  }

  // The caller's streams may still read or append to the arena: let them finish before anything
  // is freed, then destroy in reverse order of construction.
  ~Impl() {
    try {
      if (backend) backend->synchronize_all();
    } catch (...) {
      // A destructor has no caller to report to; freeing goes on regardless.
    }
    ring.reset();
    if (backend) {
      for (auto event : resident_released) backend->destroy_event(event);
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
  bool is_resident(int layer) const { return layer < plan.resident_layers; }
  std::byte* layer_base(int layer) const {
    return is_resident(layer) ? arena->resident_layer(layer) : held_buffer;
  }

  CacheConfig config;
  CachePlan plan;
  // Declared in construction order; destroyed in reverse (the ring drains first).
  std::unique_ptr<prefetch::Backend> backend;
  std::unique_ptr<offload::HostStore> store;
  std::unique_ptr<offload::DeviceArena> arena;
  std::unique_ptr<prefetch::StagingRing> ring;
  // Per resident layer: recorded at release on the caller's stream, waited at acquire, so a
  // step on another stream starts after the previous one's work on the layer (as the ring's
  // events do for streamed layers).
  std::vector<prefetch::EventHandle> resident_released;

  bool in_step = false;
  int next_layer = 0;
  int held_layer = -1;
  std::byte* held_buffer = nullptr;
  std::vector<std::int32_t> new_tokens;  // [slots] of the open step
  std::vector<std::int32_t> appended;    // [slots] rows appended to the held layer
  std::uint64_t steps = 0;
};

OffloadedStaticCache::OffloadedStaticCache(const CacheConfig& config)
    : impl_(std::make_unique<Impl>(config)) {}
OffloadedStaticCache::~OffloadedStaticCache() = default;
OffloadedStaticCache::OffloadedStaticCache(OffloadedStaticCache&&) noexcept = default;
OffloadedStaticCache& OffloadedStaticCache::operator=(OffloadedStaticCache&&) noexcept = default;

void OffloadedStaticCache::begin_step(const std::vector<std::int32_t>& new_tokens) {
  Impl& m = *impl_;
  if (m.in_step) throw protocol("begin_step while a step is open (call end_step first)");
  if (static_cast<int>(new_tokens.size()) != m.config.slots) {
    throw invalid("begin_step needs one new-token count per slot: got " +
                  std::to_string(new_tokens.size()) + ", the cache has " +
                  std::to_string(m.config.slots) + " slots");
  }
  for (int s = 0; s < m.config.slots; ++s) {
    const std::int32_t n = new_tokens[static_cast<std::size_t>(s)];
    if (n < 0) {
      throw invalid("begin_step: slot " + std::to_string(s) + " has a negative token count (" +
                    std::to_string(n) + ")");
    }
    if (static_cast<std::int64_t>(m.store->length(s)) + n > m.config.max_seq) {
      throw invalid("begin_step: slot " + std::to_string(s) + " holds " +
                    std::to_string(m.store->length(s)) + " tokens; " + std::to_string(n) +
                    " more would pass max_seq (" + std::to_string(m.config.max_seq) + ")");
    }
  }
  m.new_tokens = new_tokens;
  if (m.ring) m.ring->begin_step(m.new_tokens.data());
  m.in_step = true;
  m.next_layer = 0;
  m.held_layer = -1;
}

LayerView OffloadedStaticCache::acquire(int layer, void* stream) {
  Impl& m = *impl_;
  if (!m.in_step) throw protocol("acquire outside a step (call begin_step first)");
  if (layer < 0 || layer >= m.config.layers) {
    throw invalid("acquire: layer " + std::to_string(layer) + " is out of range (the cache has " +
                  std::to_string(m.config.layers) + " layers)");
  }
  if (m.held_layer >= 0) {
    throw protocol("acquire of layer " + std::to_string(layer) + " while layer " +
                   std::to_string(m.held_layer) + " is still held (release it first)");
  }
  if (layer != m.next_layer) {
    throw protocol("layers out of order: expected layer " + std::to_string(m.next_layer) +
                   (m.next_layer == m.config.layers ? " (none: call end_step)" : "") + ", got " +
                   std::to_string(layer));
  }
  if (m.is_resident(layer)) {
    m.backend->wait_measured(stream, m.resident_released[static_cast<std::size_t>(layer)]);
    m.held_buffer = nullptr;
  } else {
    m.held_buffer = m.ring->acquire(layer - m.plan.resident_layers, stream);
  }
  m.held_layer = layer;
  std::fill(m.appended.begin(), m.appended.end(), 0);

  LayerView view;
  view.layer = layer;
  view.resident = m.is_resident(layer);
  view.k = m.layer_base(layer);
  view.v = m.layer_base(layer) + m.plan.tensor_bytes;
  view.head_stride = m.config.head_dim;
  view.token_stride = static_cast<std::int64_t>(m.config.kv_heads) * m.config.head_dim;
  view.slot_stride = view.token_stride * m.config.max_seq;
  view.slots = m.config.slots;
  view.max_seq = m.config.max_seq;
  view.kv_heads = m.config.kv_heads;
  view.head_dim = m.config.head_dim;
  view.dtype = m.config.dtype;
  view.lengths = m.store->lengths();
  view.new_tokens = m.new_tokens.data();
  return view;
}

void OffloadedStaticCache::append(int layer, int slot, const void* k_rows, const void* v_rows,
                                  int count, void* stream) {
  Impl& m = *impl_;
  m.check_held(layer, "append");
  m.check_slot(slot);
  const auto s = static_cast<std::size_t>(slot);
  if (count < 0) throw invalid("append: negative row count " + std::to_string(count));
  if (m.appended[s] + count > m.new_tokens[s]) {
    throw invalid("append: slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                  " would get " + std::to_string(m.appended[s] + count) +
                  " rows this step, but begin_step declared " + std::to_string(m.new_tokens[s]));
  }
  if (count == 0) return;
  if (k_rows == nullptr || v_rows == nullptr) throw invalid("append: null K or V rows");

  const std::size_t row = m.plan.row_bytes;
  const std::size_t offset = (s * static_cast<std::size_t>(m.config.max_seq) +
                              static_cast<std::size_t>(m.store->length(slot) + m.appended[s])) *
                             row;
  std::byte* base = m.layer_base(layer);
  const std::size_t bytes = static_cast<std::size_t>(count) * row;
  m.backend->copy_async(base + offset, k_rows, bytes, stream);
  m.backend->copy_async(base + m.plan.tensor_bytes + offset, v_rows, bytes, stream);
  m.appended[s] += count;
}

void OffloadedStaticCache::release(int layer, void* stream) {
  Impl& m = *impl_;
  m.check_held(layer, "release");
  for (int s = 0; s < m.config.slots; ++s) {
    const auto index = static_cast<std::size_t>(s);
    if (m.appended[index] != m.new_tokens[index]) {
      throw protocol("release of layer " + std::to_string(layer) + ": slot " + std::to_string(s) +
                     " has " + std::to_string(m.appended[index]) + " of its " +
                     std::to_string(m.new_tokens[index]) + " new rows appended");
    }
  }
  if (m.is_resident(layer)) {
    m.backend->record(m.resident_released[static_cast<std::size_t>(layer)], stream);
  } else {
    m.ring->release(layer - m.plan.resident_layers, stream);
  }
  m.held_layer = -1;
  m.held_buffer = nullptr;
  m.next_layer = layer + 1;
}

void OffloadedStaticCache::end_step() {
  Impl& m = *impl_;
  if (!m.in_step) throw protocol("end_step without begin_step");
  if (m.held_layer >= 0) {
    throw protocol("end_step while layer " + std::to_string(m.held_layer) +
                   " is still held (release it first)");
  }
  if (m.next_layer != m.config.layers) {
    throw protocol("end_step after " + std::to_string(m.next_layer) + " of " +
                   std::to_string(m.config.layers) + " layers (every layer must be released)");
  }
  for (int s = 0; s < m.config.slots; ++s) {
    m.store->set_length(s, m.store->length(s) + m.new_tokens[static_cast<std::size_t>(s)]);
  }
  if (m.ring) m.ring->end_step();
  m.in_step = false;
  m.steps += 1;
}

void OffloadedStaticCache::abort_step(void* stream) {
  Impl& m = *impl_;
  if (!m.in_step) throw protocol("abort_step without an open step");
  if (m.held_layer >= 0 && m.is_resident(m.held_layer)) {
    m.backend->record(m.resident_released[static_cast<std::size_t>(m.held_layer)], stream);
  }
  if (m.ring) {
    const int held = m.held_layer >= 0 && !m.is_resident(m.held_layer)
                         ? m.held_layer - m.plan.resident_layers
                         : -1;
    m.ring->abort_step(held, stream);
  }
  m.in_step = false;
  m.held_layer = -1;
  m.held_buffer = nullptr;
}

void OffloadedStaticCache::reset_slot(int slot) {
  Impl& m = *impl_;
  m.check_between_steps("reset_slot");
  m.check_slot(slot);
  if (m.store->length(slot) == 0) return;
  m.store->reset(slot);
  if (m.ring) m.ring->forget_prefetches();
}

void OffloadedStaticCache::truncate_slot(int slot, int length) {
  Impl& m = *impl_;
  m.check_between_steps("truncate_slot");
  m.check_slot(slot);
  if (length < 0 || length > m.store->length(slot)) {
    throw invalid("truncate_slot: slot " + std::to_string(slot) + " holds " +
                  std::to_string(m.store->length(slot)) + " tokens; cannot truncate to " +
                  std::to_string(length));
  }
  if (length == m.store->length(slot)) return;
  m.store->truncate(slot, length);
  if (m.ring) m.ring->forget_prefetches();
}

int OffloadedStaticCache::length(int slot) const {
  impl_->check_slot(slot);
  return impl_->store->length(slot);
}

bool OffloadedStaticCache::in_step() const {
  return impl_->in_step;
}

CacheStats OffloadedStaticCache::stats() const {
  const Impl& m = *impl_;
  CacheStats stats;
  stats.steps = m.steps;
  if (m.ring) {
    const prefetch::RingCounters& ring = m.ring->counters();
    stats.h2d_bytes_total = ring.h2d_bytes_total;
    stats.d2h_bytes_total = ring.d2h_bytes_total;
    stats.h2d_bytes_last_step = ring.h2d_bytes_last_step;
    stats.d2h_bytes_last_step = ring.d2h_bytes_last_step;
    stats.prefetch_reissues = ring.prefetch_reissues;
  }
  stats.acquire_wait_s = m.backend->stall_seconds();
  stats.plan = m.plan;
  stats.device_allocations = m.backend->memory().device_allocations;
  return stats;
}

const CacheConfig& OffloadedStaticCache::config() const {
  return impl_->config;
}
BackendKind OffloadedStaticCache::backend() const {
  return impl_->backend->kind();
}

void* OffloadedStaticCache::reserved(const std::string& name) const {
  return impl_->arena->reserved(name);
}

void* OffloadedStaticCache::create_stream() {
  return impl_->backend->create_stream();
}
void OffloadedStaticCache::destroy_stream(void* stream) noexcept {
  impl_->backend->destroy_stream(stream);
}
void OffloadedStaticCache::launch_host_func(void* stream, void (*fn)(void*), void* arg) {
  impl_->backend->launch_host_func(stream, fn, arg);
}
void OffloadedStaticCache::synchronize_stream(void* stream) {
  impl_->backend->synchronize_stream(stream);
}
void OffloadedStaticCache::synchronize() {
  if (impl_->ring) impl_->ring->drain();
}
void OffloadedStaticCache::copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  impl_->backend->copy_sync(host_dst, device_src, bytes);
}
void OffloadedStaticCache::copy_to_device(void* device_dst, const void* host_src,
                                          std::size_t bytes) {
  impl_->backend->copy_sync(device_dst, host_src, bytes);
}

}  // namespace kvo
