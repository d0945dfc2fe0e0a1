// OffloadedStaticCache: checks the per-step protocol, then hands resident layers to the arena
// and streamed layers to the staging ring. Every check runs before any state changes, so a call
// that throws leaves the cache as it was.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "prefetch/api/cache_impl.hpp"

namespace kvo {

namespace {

// One step of reorder_slots in place: slot `to` takes slot `from`'s rows (`from` -1: the
// scratch), or, with `to` -1, slot `from`'s rows are saved to the scratch.
struct SlotMove {
  int to;
  int from;
};

// The order in which every slot s with source[s] != s takes source[s]'s rows in place, no slot
// written while a later move still reads it. Where only cycles remain, one slot of a cycle is
// saved to the scratch and its readers read that instead; the cycle then unwinds as a chain
// before another is broken, so one scratch serves all. Slots are few: quadratic is fine.
std::vector<SlotMove> slot_moves(const std::vector<int>& source) {
  const int slots = static_cast<int>(source.size());
  std::vector<int> from(source);
  std::vector<bool> pending(static_cast<std::size_t>(slots));
  std::vector<int> readers(static_cast<std::size_t>(slots), 0);  // pending moves reading a slot
  int left = 0;
  for (int s = 0; s < slots; ++s) {
    if (source[static_cast<std::size_t>(s)] == s) continue;
    pending[static_cast<std::size_t>(s)] = true;
    ++readers[static_cast<std::size_t>(source[static_cast<std::size_t>(s)])];
    ++left;
  }
  std::vector<SlotMove> moves;
  while (left > 0) {
    int next = -1;
    for (int s = 0; s < slots && next < 0; ++s) {
      if (pending[static_cast<std::size_t>(s)] && readers[static_cast<std::size_t>(s)] == 0) {
        next = s;
      }
    }
    if (next < 0) {  // only cycles left: save the first pending slot, its readers read that
      int saved = 0;
      while (!pending[static_cast<std::size_t>(saved)]) ++saved;
      moves.push_back({-1, saved});
      for (int t = 0; t < slots; ++t) {
        if (pending[static_cast<std::size_t>(t)] && from[static_cast<std::size_t>(t)] == saved) {
          from[static_cast<std::size_t>(t)] = -1;
        }
      }
      readers[static_cast<std::size_t>(saved)] = 0;
      continue;
    }
    const int reads = from[static_cast<std::size_t>(next)];
    moves.push_back({next, reads});
    if (reads >= 0) --readers[static_cast<std::size_t>(reads)];
    pending[static_cast<std::size_t>(next)] = false;
    --left;
  }
  return moves;
}

}  // namespace

OffloadedStaticCache::OffloadedStaticCache(const CacheConfig& config)
    : impl_(std::make_unique<Impl>(config)) {}
OffloadedStaticCache::~OffloadedStaticCache() = default;
OffloadedStaticCache::OffloadedStaticCache(OffloadedStaticCache&&) noexcept = default;
OffloadedStaticCache& OffloadedStaticCache::operator=(OffloadedStaticCache&&) noexcept = default;

void OffloadedStaticCache::begin_step(const std::vector<std::int32_t>& new_tokens) {
  impl_->open_step(new_tokens, nullptr);
}

void OffloadedStaticCache::begin_step(const std::vector<std::int32_t>& new_tokens,
                                      const std::vector<std::int32_t>& split_rows) {
  impl_->open_step(new_tokens, &split_rows);
}

void OffloadedStaticCache::Impl::open_step(const std::vector<std::int32_t>& counts,
                                           const std::vector<std::int32_t>* given) {
  Impl& m = *this;
  if (m.in_step) throw protocol("begin_step while a step is open (call end_step first)");
  if (static_cast<int>(counts.size()) != m.config.slots) {
    throw invalid("begin_step needs one new-token count per slot: got " +
                  std::to_string(counts.size()) + ", the cache has " +
                  std::to_string(m.config.slots) + " slots");
  }
  for (int s = 0; s < m.config.slots; ++s) {
    const std::int32_t n = counts[static_cast<std::size_t>(s)];
    if (n < 0) {
      throw invalid("begin_step: slot " + std::to_string(s) + " has a negative token count (" +
                    std::to_string(n) + ")");
    }
    if (static_cast<std::int64_t>(m.lengths[s]) + n > m.config.max_seq) {
      throw invalid("begin_step: slot " + std::to_string(s) + " holds " +
                    std::to_string(m.lengths[s]) + " tokens; " + std::to_string(n) +
                    " more would pass max_seq (" + std::to_string(m.config.max_seq) + ")");
    }
    if (n > 0 && m.window_layers->lost(s)) {
      throw invalid("begin_step: slot " + std::to_string(s) +
                    " lost rows of its window layers in an aborted step (they had moved to make "
                    "room for rows that step appended); reset_slot it, or truncate_slot it to a "
                    "length its windows still hold");
    }
  }
  if (given != nullptr) {
    if (static_cast<int>(given->size()) != m.config.slots) {
      throw invalid("begin_step needs one split row per slot: got " +
                    std::to_string(given->size()) + ", the cache has " +
                    std::to_string(m.config.slots) + " slots");
    }
    for (int s = 0; s < m.config.slots; ++s) {
      const auto i = static_cast<std::size_t>(s);
      const std::int32_t r = (*given)[i];
      if (r < 0 || r > m.lengths[i]) {
        throw invalid("begin_step: slot " + std::to_string(s) + "'s split row " +
                      std::to_string(r) + " is not within its " + std::to_string(m.lengths[i]) +
                      " rows");
      }
      if (r > 0 && counts[i] != 1) {
        throw invalid("begin_step: slot " + std::to_string(s) + " splits at row " +
                      std::to_string(r) + " but appends " + std::to_string(counts[i]) +
                      " rows: split attention is for decode steps (one row each)");
      }
    }
  }
  m.new_tokens = counts;
  // A decoding slot (one new row) splits where the caller or the config says; its next step is
  // guessed to decode too: at the same row when given, else at the config's row for its length
  // after this step. Nothing splits when nothing streams.
  m.splits = false;
  for (int s = 0; s < m.config.slots; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const bool decodes = m.plan.streamed_layers > 0 && counts[i] == 1;
    if (given != nullptr) {
      m.split[i] = m.plan.streamed_layers > 0 ? (*given)[i] : 0;
      m.next_split[i] = m.split[i];
    } else {
      m.split[i] = decodes ? split_rows(m.config.split, m.lengths[i]) : 0;
      m.next_split[i] = decodes ? split_rows(m.config.split, m.lengths[i] + 1) : 0;
    }
    m.splits = m.splits || m.split[i] > 0;
  }
  if (m.ring) m.ring->begin_step(m.new_tokens.data(), m.split.data(), m.next_split.data());
  m.in_step = true;
  m.next_layer = 0;
  m.held_layer = -1;
}

LayerView LayerView::of(const KvLayout& layout, void* k, void* v) {
  LayerView view;
  view.k = k;
  view.v = v;
  view.layout = layout;
  // Strides in elements; a quantized row's scales sit inside its token stride.
  view.head_stride = layout.head_dim;
  view.token_stride = static_cast<std::int64_t>(layout.k_row_bytes / layout.element_size);
  view.slot_stride = view.token_stride * layout.max_seq;
  view.v_head_stride = layout.v_head_dim;
  view.v_token_stride = static_cast<std::int64_t>(layout.v_row_bytes / layout.element_size);
  view.v_slot_stride = view.v_token_stride * layout.max_seq;
  return view;
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
  m.backend->check_stream(stream);
  const int w = m.window(layer);
  const bool split = m.splits && !m.on_device(layer);
  // Rows [0, split) stay in the host store, read there by the host: its last write-back of this
  // layer (the previous step's rows) must have landed. Waited before anything changes.
  if (split) m.ring->wait_written(m.streamed(layer));
  if (m.on_device(layer)) {
    m.backend->wait_measured(stream, m.released[static_cast<std::size_t>(layer)].get());
    m.held_buffer = nullptr;
  } else {
    m.held_buffer = m.ring->acquire(m.streamed(layer), stream);
  }
  m.held_layer = layer;
  std::fill(m.appended.begin(), m.appended.end(), 0);

  const KvLayout& layout =
      w >= 0 ? m.windows.windows[static_cast<std::size_t>(w)].layout : m.plan.layout;
  LayerView view =
      LayerView::of(layout, m.layer_base(layer), m.layer_base(layer) + layout.v_begin());
  view.layer = layer;
  view.resident = m.on_device(layer);
  view.lengths = m.lengths.data();
  view.new_tokens = m.new_tokens.data();
  if (w >= 0) {
    view.window = m.windows.windows[static_cast<std::size_t>(w)].window;
    view.first_positions = m.window_layers->first_positions(w);
  }
  if (split) {
    view.split_rows = m.split.data();
    view.host_k = m.store->k(m.streamed(layer), 0);
    view.host_v = m.store->v(m.streamed(layer), 0);
  }
  return view;
}

void OffloadedStaticCache::append(int layer, int slot, const void* k_rows, const void* v_rows,
                                  int count, void* stream) {
  Impl& m = *impl_;
  m.check_held(layer, "append");
  m.check_slot(slot);
  const auto s = static_cast<std::size_t>(slot);
  if (count < 0) throw invalid("append: negative row count " + std::to_string(count));
  // In 64 bits: appended + count can pass INT32_MAX.
  const std::int64_t total = static_cast<std::int64_t>(m.appended[s]) + count;
  if (total > m.new_tokens[s]) {
    throw invalid("append: slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                  " would get " + std::to_string(total) +
                  " rows this step, but begin_step declared " + std::to_string(m.new_tokens[s]));
  }
  if (count == 0) return;
  if (k_rows == nullptr || v_rows == nullptr) throw invalid("append: null K or V rows");
  if (m.window(layer) >= 0 && count > m.config.max_append) {
    throw invalid("append: layer " + std::to_string(layer) +
                  " is a window layer, which takes at "
                  "most max_append (" +
                  std::to_string(m.config.max_append) + ") rows of a slot per call; got " +
                  std::to_string(count));
  }
  m.backend->check_stream(stream);

  const int w = m.window(layer);
  if (w >= 0) {
    m.window_layers->append(w, slot, m.lengths[s] + m.appended[s], k_rows, v_rows, count, stream);
    m.appended[s] += count;
    return;
  }
  const KvLayout& l = m.plan.layout;
  const int token = m.lengths[s] + m.appended[s];
  std::byte* base = m.layer_base(layer);
  m.backend->copy_async(base + l.k_offset(slot, token), k_rows, l.k_bytes(count), stream);
  m.backend->copy_async(base + l.v_begin() + l.v_offset(slot, token), v_rows, l.v_bytes(count),
                        stream);
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
  m.backend->check_stream(stream);
  if (m.on_device(layer)) {
    m.backend->record(m.released[static_cast<std::size_t>(layer)].get(), stream);
  } else {
    m.ring->release(m.streamed(layer), stream);
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
    m.lengths[static_cast<std::size_t>(s)] += m.new_tokens[static_cast<std::size_t>(s)];
  }
  if (m.ring) m.ring->end_step();
  m.in_step = false;
  m.steps += 1;
}

void OffloadedStaticCache::abort_step(void* stream) {
  Impl& m = *impl_;
  if (!m.in_step) throw protocol("abort_step without an open step");
  m.backend->check_stream(stream);
  const bool held_on_device = m.held_layer >= 0 && m.on_device(m.held_layer);
  if (held_on_device) {
    m.backend->record(m.released[static_cast<std::size_t>(m.held_layer)].get(), stream);
  }
  if (m.ring) {
    const int held = m.held_layer >= 0 && !held_on_device ? m.streamed(m.held_layer) : -1;
    m.ring->abort_step(held, stream);
  }
  m.window_layers->mark_lost(m.lengths);
  m.in_step = false;
  m.held_layer = -1;
  m.held_buffer = nullptr;
}

void OffloadedStaticCache::reset_slot(int slot) {
  Impl& m = *impl_;
  m.check_between_steps("reset_slot");
  m.check_slot(slot);
  m.window_layers->reset(slot);
  if (m.lengths[static_cast<std::size_t>(slot)] == 0) return;
  m.lengths[static_cast<std::size_t>(slot)] = 0;
  if (m.ring) m.ring->forget_prefetches();
}

void OffloadedStaticCache::reorder_slots(const std::vector<int>& source) {
  Impl& m = *impl_;
  m.check_between_steps("reorder_slots");
  const int slots = m.config.slots;
  if (static_cast<int>(source.size()) != slots) {
    throw invalid("reorder_slots: " + std::to_string(source.size()) + " sources for " +
                  std::to_string(slots) + " slots");
  }
  bool identity = true;
  for (int s = 0; s < slots; ++s) {
    const int from = source[static_cast<std::size_t>(s)];
    if (from < 0 || from >= slots) {
      throw invalid("reorder_slots: source[" + std::to_string(s) + "] is " + std::to_string(from) +
                    ", not a slot (the cache has " + std::to_string(slots) + ")");
    }
    identity = identity && from == s;
  }
  if (identity) return;
  m.quiesce();  // no copy of the ring or the caller still reads or writes the rows
  const KvLayout& l = m.plan.layout;
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    lengths[static_cast<std::size_t>(s)] = m.lengths[static_cast<std::size_t>(source[s])];
  }
  // Rows move in place, where they live: a streamed layer's in the host store, a resident
  // layer's on the device (device to device, nothing over the bus). A cycle's first slot is
  // saved to a scratch first: on the device a staging buffer (idle now: the ring is quiesced and
  // its prefetches are issued again after), or the host when nothing is streamed.
  const std::vector<SlotMove> moves = slot_moves(source);
  std::vector<std::byte> host_scratch;
  std::byte* device_scratch = m.plan.ring_depth > 0 ? m.arena->staging_buffer(0) : nullptr;
  // The full layers (indices among them, as CacheSlotRows takes them).
  for (int layer = 0; layer < m.windows.full.layers; ++layer) {
    const bool resident = layer < m.plan.resident_layers;
    for (int kv = 0; kv < 2; ++kv) {
      const std::uint64_t row = kv == 0 ? l.k_row_bytes : l.v_row_bytes;
      const auto rows_of = [&](int slot) {
        CacheSlotRows rows(*m.backend, *m.store, *m.arena, m.plan, slot);
        return resident ? rows.device_rows(layer, kv) : rows.host_rows(layer, kv);
      };
      const auto copy = [&](void* to, const void* from, std::size_t bytes, bool host_side) {
        if (bytes == 0) return;
        if (host_side) {
          std::memcpy(to, from, bytes);
        } else {
          m.backend->copy_sync(to, from, bytes);
        }
      };
      std::byte* scratch = nullptr;
      for (const SlotMove& move : moves) {
        if (move.to < 0) {  // save slot `from`'s rows before a cycle overwrites it
          const std::size_t bytes =
              static_cast<std::size_t>(m.lengths[static_cast<std::size_t>(move.from)]) * row;
          if (resident && device_scratch != nullptr) {
            scratch = device_scratch;
          } else {
            host_scratch.resize(bytes);
            scratch = host_scratch.data();
          }
          copy(scratch, rows_of(move.from), bytes, !resident);
          continue;
        }
        const std::size_t bytes =
            static_cast<std::size_t>(lengths[static_cast<std::size_t>(move.to)]) * row;
        const std::byte* from = move.from >= 0 ? rows_of(move.from) : scratch;
        copy(rows_of(move.to), from, bytes, !resident);
        m.reorder_bytes += bytes;
      }
    }
  }
  // The window layers: each slot's held rows through host memory (they are a window's worth).
  m.reorder_bytes += m.window_layers->reorder(source, m.lengths);
  m.lengths = lengths;
  if (m.ring) m.ring->forget_prefetches();
}

void OffloadedStaticCache::truncate_slot(int slot, int length) {
  Impl& m = *impl_;
  m.check_between_steps("truncate_slot");
  m.check_slot(slot);
  std::int32_t& held = m.lengths[static_cast<std::size_t>(slot)];
  if (length < 0 || length > held) {
    throw invalid("truncate_slot: slot " + std::to_string(slot) + " holds " + std::to_string(held) +
                  " tokens; cannot truncate to " + std::to_string(length));
  }
  if (length == 0) m.window_layers->reset(slot);
  if (!m.window_layers->covers(slot, length)) {
    throw invalid("truncate_slot: slot " + std::to_string(slot) +
                  "'s window layers no longer hold the rows a length of " + std::to_string(length) +
                  " needs (they keep the last rows of each window); "
                  "truncate to a longer length, or to 0");
  }
  m.window_layers->clear_lost(slot);
  if (length == held) return;
  held = length;
  if (m.ring) m.ring->forget_prefetches();
}

int OffloadedStaticCache::length(int slot) const {
  impl_->check_slot(slot);
  return impl_->lengths[static_cast<std::size_t>(slot)];
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
  stats.reorder_bytes = m.reorder_bytes;
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
void OffloadedStaticCache::destroy_stream(void* stream) {
  if (!impl_->backend->destroy_stream(stream)) {
    throw invalid(
        "destroy_stream: the handle is not a stream this cache made (or it was "
        "destroyed already); nothing was freed");
  }
}
void OffloadedStaticCache::launch_host_func(void* stream, void (*fn)(void*), void* arg) {
  impl_->backend->check_stream(stream);
  impl_->backend->launch_host_func(stream, fn, arg);
}
void OffloadedStaticCache::synchronize_stream(void* stream) {
  impl_->backend->check_stream(stream);
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
