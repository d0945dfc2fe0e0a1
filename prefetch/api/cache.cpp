// OffloadedStaticCache: checks the per-step protocol, then hands resident layers to the arena
// and streamed layers to the staging ring. Every check runs before any state changes, so a call
// that throws leaves the cache as it was.
#include <algorithm>
#include <cstring>
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
#include "offload/util/byte_io.hpp"
#include "prefetch/backend/backend.hpp"
#include "prefetch/backend/rate_probe.hpp"
#include "prefetch/ring/staging_ring.hpp"

namespace kvo {

namespace {

Error protocol(const std::string& what) {
  return Error(ErrorCode::kProtocol, what);
}
Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

}  // namespace

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
    if (!windows.windows.empty()) window_base = arena->reserved(kWindowRegion);
    for (std::size_t w = 0; w < windows.windows.size(); ++w) {
      window_first.emplace_back(static_cast<std::size_t>(config.slots), 0);
    }
    for (int l = 0; l < config.layers; ++l) {
      released.push_back(on_device(l) ? prefetch::Event(*backend) : prefetch::Event());
    }
    window_lost.assign(static_cast<std::size_t>(config.slots), 0);
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
  // A window layer's K (kv 0) or V rows of `slot`, from its first row.
  std::byte* window_slot_rows(int w, int slot, int kv) const {
    const offload::WindowPlan::Window& win = windows.windows[static_cast<std::size_t>(w)];
    const KvLayout& l = win.layout;
    return window_base + win.offset +
           (kv == 0 ? l.k_offset(slot, 0) : l.v_begin() + l.v_offset(slot, 0));
  }
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
  // A window layer's rows of one append: after the slot's held rows, in order. When they would
  // pass the buffer, the window - 1 rows before the first new one (all its window needs) move
  // to the front first, on the caller's stream, in pieces of `from` rows (the shift) from the
  // front: no piece overlaps itself, and none reads a row an earlier one wrote. window_rows'
  // gap makes `from` more than an eighth of the rows kept, so there are at most 8 pieces.
  void window_append(int w, int slot, const void* k_rows, const void* v_rows, int count,
                     void* stream) {
    const offload::WindowPlan::Window& win = windows.windows[static_cast<std::size_t>(w)];
    const KvLayout& l = win.layout;
    const auto s = static_cast<std::size_t>(slot);
    std::int32_t& first = window_first[static_cast<std::size_t>(w)][s];
    const int position = lengths[s] + appended[s];  // of the first new row
    int held = position - first;
    if (held + count > l.max_seq) {
      const int keep = std::min(held, win.window - 1);
      const int from = held - keep;  // >= 1: held > max_seq - count >= window - 1
      for (int done = 0; done < keep; done += from) {
        const int rows = std::min(from, keep - done);
        for (int kv = 0; kv < 2; ++kv) {
          const auto bytes = [&](int n) { return kv == 0 ? l.k_bytes(n) : l.v_bytes(n); };
          backend->copy_async(window_slot_rows(w, slot, kv) + bytes(done),
                              window_slot_rows(w, slot, kv) + bytes(from + done), bytes(rows),
                              stream);
        }
      }
      first = position - keep;
      held = keep;
    }
    backend->copy_async(window_slot_rows(w, slot, 0) + l.k_bytes(held), k_rows, l.k_bytes(count),
                        stream);
    backend->copy_async(window_slot_rows(w, slot, 1) + l.v_bytes(held), v_rows, l.v_bytes(count),
                        stream);
  }
  // Whether every window layer of `slot` holds what a length of `length` needs: the window - 1
  // rows before it (all rows, from position 0, when it is shorter).
  bool windows_cover(int slot, int length) const {
    for (std::size_t w = 0; w < windows.windows.size(); ++w) {
      const int need = std::max(0, length - (windows.windows[w].window - 1));
      if (window_first[w][static_cast<std::size_t>(slot)] > need) return false;
    }
    return true;
  }
  // After an aborted step: a slot whose window layers moved rows past what its committed length
  // needs can no longer take a step (begin_step refuses it) until it is reset or truncated.
  void mark_lost_windows() {
    for (int s = 0; s < config.slots; ++s) {
      if (!windows_cover(s, lengths[static_cast<std::size_t>(s)])) {
        window_lost[static_cast<std::size_t>(s)] = 1;
      }
    }
  }
  void reset_windows(int slot) {
    for (auto& first : window_first) first[static_cast<std::size_t>(slot)] = 0;
    window_lost[static_cast<std::size_t>(slot)] = 0;
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
    if (window(layer) >= 0) return window_slot_rows(window(layer), 0, 0);
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
  // The window layers (CacheConfig::layer_windows): where each lies, and per slot the position
  // of its first row.
  offload::WindowPlan windows;
  std::byte* window_base = nullptr;
  std::vector<std::vector<std::int32_t>> window_first;  // [window layer][slot]
  std::vector<std::uint8_t> window_lost;                // [slot]: see mark_lost_windows

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

namespace {

// One slot's rows as a saved context sees them: streamed layers in the host store, resident
// layers in the device arena.
class CacheSlotRows : public offload::SlotRows {
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

void OffloadedStaticCache::Impl::save(const std::vector<int>& slots, offload::ByteSink& sink,
                                      const std::vector<SlotContext>& contexts, const char* call) {
  check_slots(slots, call);
  check_no_windows(call);
  if (contexts.size() != slots.size()) {
    throw invalid(std::string(call) + ": " + std::to_string(contexts.size()) + " contexts for " +
                  std::to_string(slots.size()) + " slots");
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::size_t ids = contexts[i].tokens.size();
    if (ids != 0 && ids != static_cast<std::size_t>(lengths[slots[i]])) {
      throw invalid(std::string(call) + ": slot " + std::to_string(slots[i]) + " holds " +
                    std::to_string(lengths[slots[i]]) + " rows but " + std::to_string(ids) +
                    " token ids were given (give one per row, or none)");
    }
  }
  const offload::ContextShape shape = context_shape();
  quiesce();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    offload::ContextHeader header{shape, lengths[slots[i]], held() + contexts[i].model,
                                  contexts[i].tokens};
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    offload::write_context(sink, header, rows);
  }
}

std::vector<SlotContext> OffloadedStaticCache::Impl::load(const std::vector<int>& slots,
                                                          offload::ByteSource& source,
                                                          const std::string& model,
                                                          const std::string& what,
                                                          bool whole_input) {
  check_slots(slots, "load_slot");
  check_no_windows("load_slot");
  const offload::ContextShape shape = context_shape();
  quiesce();
  // Every record is read and checked before any length changes: a slot that holds rows gets
  // its record staged, an empty one gets it in place (rows past length 0 are nobody's).
  std::vector<offload::ContextHeader> headers;
  std::vector<std::vector<std::byte>> staged(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::string record = slots.size() > 1
                                   ? what + " (saved context " + std::to_string(i + 1) + " of " +
                                         std::to_string(slots.size()) + ")"
                                   : what;
    offload::ContextHeader header = offload::read_context_header(source, record);
    offload::check_context_fits(header, shape, held() + model, record);
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    const bool in_place = lengths[slots[i]] == 0;
    offload::read_context_rows(source, header, rows, in_place ? nullptr : &staged[i], record);
    headers.push_back(std::move(header));
  }
  if (whole_input) {
    char extra = 0;
    if (source.read(&extra, 1) != 0) {
      throw invalid(what + ": more bytes follow its " + std::to_string(slots.size()) +
                    " saved context(s) (load as many slots as were saved); nothing was loaded");
    }
  }
  std::vector<SlotContext> contexts;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    if (lengths[slots[i]] != 0) offload::commit_staged_rows(headers[i], rows, staged[i]);
    lengths[slots[i]] = headers[i].length;
    contexts.push_back({std::move(headers[i].tokens), std::move(headers[i].model)});
  }
  if (ring) ring->forget_prefetches();
  return contexts;
}

struct __attribute__((visibility("hidden"))) SavedContextFile::Impl {
  Impl(const std::string& p, ContextReading reading)
      : path(p), source(p, reading == ContextReading::kMapped) {}
  std::string path;
  offload::FileSource source;
  SavedContextInfo info;
};

SavedContextFile::SavedContextFile(const std::string& path, ContextReading reading)
    : impl_(std::make_unique<Impl>(path, reading)) {
  offload::FileSource& source = impl_->source;
  SavedContextInfo& info = impl_->info;
  const std::string what = "saved context " + path;
  std::uint64_t offset = 0;
  do {
    offload::ContextHeader header = offload::read_context_header(source, what);
    if (!info.lengths.empty() &&
        (header.shape.layers != info.layers || header.shape.kv_heads != info.kv_heads ||
         header.shape.head_dim != info.head_dim || header.shape.max_seq != info.max_seq ||
         header.shape.v_head_dim != info.v_head_dim || header.shape.dtype != info.dtype)) {
      throw invalid(what + ": its saved contexts differ in shape");
    }
    info.layers = header.shape.layers;
    info.kv_heads = header.shape.kv_heads;
    info.head_dim = header.shape.head_dim;
    info.v_head_dim = header.shape.v_head_dim;
    info.max_seq = header.shape.max_seq;
    info.dtype = header.shape.dtype;
    info.lengths.push_back(header.length);
    offload::skip_context_rows(source, header, what);
    offset += offload::context_record_bytes(header);
    info.contexts.push_back({std::move(header.tokens), std::move(header.model)});
  } while (offset < source.size());
}

SavedContextFile::~SavedContextFile() = default;
SavedContextFile::SavedContextFile(SavedContextFile&&) noexcept = default;
SavedContextFile& SavedContextFile::operator=(SavedContextFile&&) noexcept = default;

const SavedContextInfo& SavedContextFile::info() const {
  return impl_->info;
}
const std::string& SavedContextFile::path() const {
  return impl_->path;
}

SavedContextInfo inspect_saved_context(const std::string& path) {
  return SavedContextFile(path).info();
}

void check_save_path(const std::string& path) {
  offload::AtomicFileSink::check_path(path);
}

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
    if (n > 0 && m.window_lost[static_cast<std::size_t>(s)] != 0) {
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
    view.first_positions = m.window_first[static_cast<std::size_t>(w)].data();
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
    m.window_append(w, slot, k_rows, v_rows, count, stream);
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
  m.mark_lost_windows();
  m.in_step = false;
  m.held_layer = -1;
  m.held_buffer = nullptr;
}

void OffloadedStaticCache::reset_slot(int slot) {
  Impl& m = *impl_;
  m.check_between_steps("reset_slot");
  m.check_slot(slot);
  m.reset_windows(slot);
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
  for (std::size_t w = 0; w < m.windows.windows.size(); ++w) {
    const KvLayout& wl = m.windows.windows[w].layout;
    std::vector<std::int32_t>& first = m.window_first[w];
    std::vector<std::vector<std::byte>> held(static_cast<std::size_t>(slots) * 2);
    for (int s = 0; s < slots; ++s) {
      const std::int64_t rows =
          m.lengths[static_cast<std::size_t>(s)] - first[static_cast<std::size_t>(s)];
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<std::byte>& h = held[static_cast<std::size_t>(2 * s + kv)];
        h.resize(kv == 0 ? wl.k_bytes(rows) : wl.v_bytes(rows));
        if (!h.empty())
          m.backend->copy_sync(h.data(), m.window_slot_rows(static_cast<int>(w), s, kv), h.size());
      }
    }
    const std::vector<std::int32_t> old_first = first;
    for (int s = 0; s < slots; ++s) {
      const int from = source[static_cast<std::size_t>(s)];
      first[static_cast<std::size_t>(s)] = old_first[static_cast<std::size_t>(from)];
      if (from == s) continue;
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<std::byte>& h = held[static_cast<std::size_t>(2 * from + kv)];
        if (!h.empty())
          m.backend->copy_sync(m.window_slot_rows(static_cast<int>(w), s, kv), h.data(), h.size());
        m.reorder_bytes += h.size();
      }
    }
  }
  std::vector<std::uint8_t> lost(static_cast<std::size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    lost[static_cast<std::size_t>(s)] =
        m.window_lost[static_cast<std::size_t>(source[static_cast<std::size_t>(s)])];
  }
  m.window_lost = lost;
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
  if (length == 0) m.reset_windows(slot);
  if (!m.windows_cover(slot, length)) {
    throw invalid("truncate_slot: slot " + std::to_string(slot) +
                  "'s window layers no longer hold the rows a length of " + std::to_string(length) +
                  " needs (they keep the last rows of each window); "
                  "truncate to a longer length, or to 0");
  }
  m.window_lost[static_cast<std::size_t>(slot)] = 0;
  if (length == held) return;
  held = length;
  if (m.ring) m.ring->forget_prefetches();
}

void OffloadedStaticCache::save_slot(int slot, const std::string& path,
                                     const SlotContext& context) {
  save_slots({slot}, path, {context});
}

void OffloadedStaticCache::save_slots(const std::vector<int>& slots, const std::string& path,
                                      const std::vector<SlotContext>& contexts) {
  impl_->check_slots(slots, "save_slot");
  offload::AtomicFileSink sink(path);
  impl_->save(slots, sink, contexts, "save_slot");
  sink.commit();
}

void OffloadedStaticCache::save_slot(int slot, std::ostream& out, const SlotContext& context) {
  offload::StreamSink sink(out);
  impl_->save({slot}, sink, {context}, "save_slot");
}

SlotContext OffloadedStaticCache::load_slot(int slot, const std::string& path,
                                            const std::string& model) {
  return load_slots({slot}, path, model).front();
}

std::vector<SlotContext> OffloadedStaticCache::load_slots(const std::vector<int>& slots,
                                                          const std::string& path,
                                                          const std::string& model) {
  impl_->check_slots(slots, "load_slot");
  SavedContextFile file(path, impl_->config.context_reading);
  return load_slots(slots, file, model);
}

std::vector<SlotContext> OffloadedStaticCache::load_slots(const std::vector<int>& slots,
                                                          SavedContextFile& file,
                                                          const std::string& model) {
  impl_->check_slots(slots, "load_slot");
  offload::FileSource& source = file.impl_->source;
  source.rewind();
  return impl_->load(slots, source, model, "saved context " + file.path(), /*whole_input=*/true);
}

SlotContext OffloadedStaticCache::load_slot(int slot, std::istream& in, const std::string& model) {
  offload::StreamSource source(in);
  return impl_->load({slot}, source, model, "saved context (stream)", /*whole_input=*/false)
      .front();
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
