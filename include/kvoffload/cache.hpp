// kvo::OffloadedStaticCache: a statically allocated K/V cache whose full length lives in pinned
// host memory, streamed layer by layer through a ring of device staging buffers.
//
// The per-step protocol (every caller follows it; the model in model/ does too):
//
//   cache.begin_step(n);                 // n[s] >= 0 new tokens for each slot s
//   for (int layer = 0; layer < layers; ++layer) {
//     LayerView view = cache.acquire(layer, stream);   // stream waits until the prefix is there
//     cache.append(layer, s, k_rows, v_rows, count, stream);  // once or more per slot, until
//                                                              // count adds up to n[s]
//     ... attention over rows [0, view.lengths[s] + view.new_tokens[s]) on `stream` ...
//     cache.release(layer, stream);      // caller's work on this layer is enqueued
//   }
//   cache.end_step();                    // lengths[s] += n[s]
//
// Nothing here blocks the host on the CUDA backend: acquire makes `stream` wait on an event,
// release records one. Copies run on the cache's own H2D and D2H streams. Only the valid prefix
// of each streamed layer moves host->device, and only the rows appended in the step move back.
// A window layer (CacheConfig::layer_windows) never moves: its rows stay on the device, the last
// ones of each window alone (LayerView::first_positions says where they start).
//
// Threading: one thread at a time calls into one cache. Streams: `stream` is a cudaStream_t on
// the CUDA backend (nullptr is the legacy default stream); on the host backend it is nullptr
// (the calling thread itself, synchronous) or a stream made by create_stream(). A stream the
// cache destroyed, or on the host backend any handle it did not make, is refused with
// kInvalidArgument (running it synchronously would hide the ordering it exists to test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include "kvoffload/api.h"

#include "kvoffload/config.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "kvoffload/types.hpp"

namespace kvo {

// A non-owning view of one layer's K and V on the device, valid from acquire until release.
// Layout NHD per slot: k[slot][token][kv_head][head_dim], v the same with v_head_dim (equal to
// head_dim but for multi-head latent attention). `layout` is the cache's own (kv_layout(config)):
// shape, dtype, row bytes and, for quantized dtypes, where a row's scales start; the strides say
// how this view's memory is walked, in elements (a quantized row's scales sit inside its token
// stride, and its elements are bytes).
struct LayerView {
  int layer = 0;
  bool resident = false;  // kept whole on the device (no copies)
  void* k = nullptr;      // [slots][max_seq][kv_heads][head_dim]
  void* v = nullptr;      // [slots][max_seq][kv_heads][v_head_dim]
  KvLayout layout;
  std::int64_t slot_stride = 0;  // of k
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t v_slot_stride = 0;  // of v
  std::int64_t v_token_stride = 0;
  std::int64_t v_head_stride = 0;
  // Host arrays of `layout.slots` entries, owned by the cache, valid until end_step:
  const std::int32_t* lengths = nullptr;     // rows valid before this step
  const std::int32_t* new_tokens = nullptr;  // rows this step appends
  // A window layer (CacheConfig::layer_windows): the keys its attention sees, and per slot the
  // position of its row 0 (host array, which append updates: read it after the slot's appends).
  // Its rows are positions [first_positions[s], lengths[s] + new_tokens[s]) in order, in a
  // buffer of layout.max_seq (window_rows) rows per slot; attend over a row's window there. A
  // full layer: window 0 and first_positions null (row r is position r).
  int window = 0;
  const std::int32_t* first_positions = nullptr;
  // Split attention (CacheConfig::split, or begin_step's split_rows): a streamed layer of a step
  // that splits holds, for slot s, only rows [split_rows[s], lengths[s] + new_tokens[s]) in k
  // and v; rows [0, split_rows[s]) are in host memory at host_k and host_v (the host store, laid
  // out as k and v with the same strides), readable by the host once acquire returns. Attend the
  // two parts apart and merge them by their log-sum-exps. All three null when the layer does
  // not split this step.
  const std::int32_t* split_rows = nullptr;
  const void* host_k = nullptr;
  const void* host_v = nullptr;

  // A view of `k` and `v` laid out as `layout` says, strides included: what acquire returns.
  KVO_API static LayerView of(const KvLayout& layout, void* k, void* v);

  std::size_t element_size() const { return dtype_size(layout.dtype); }
  void* k_row(int slot, int token) const {
    return row(k, slot * slot_stride + static_cast<std::int64_t>(token) * token_stride);
  }
  void* v_row(int slot, int token) const {
    return row(v, slot * v_slot_stride + static_cast<std::int64_t>(token) * v_token_stride);
  }

 private:
  void* row(void* base, std::int64_t element) const {
    return static_cast<char*>(base) + element * static_cast<std::int64_t>(element_size());
  }
};

struct CacheStats {
  std::uint64_t steps = 0;                // committed by end_step
  std::uint64_t h2d_bytes_total = 0;      // prefetched prefixes, exact
  std::uint64_t d2h_bytes_total = 0;      // written-back new rows, exact
  std::uint64_t h2d_bytes_last_step = 0;  // prefetches made for the last committed step
  std::uint64_t d2h_bytes_last_step = 0;  // write-backs of the last committed step
  double acquire_wait_s = 0;  // time acquire's waits held the caller's stream: the waits that
                              // have completed (exact once the caller's stream is idle)
  // Prefetches of the next step discarded because the host rows they copy changed under them
  // (abort_step, reset_slot, truncate_slot, load_slot), each issued again.
  std::uint64_t prefetch_reissues = 0;
  std::uint64_t reorder_bytes = 0;       // rows written by reorder_slots, K and V, every layer
  CachePlan plan;                        // planned (and allocated) bytes per purpose
  std::uint64_t device_allocations = 0;  // device allocations made; fixed after construction
};

// What a saved context holds besides the rows of its slot.
struct SlotContext {
  // The token ids the rows were computed from: empty, or one per row.
  std::vector<std::int32_t> tokens;
  // The caller's fingerprint of the model: the library's format (kvoffload/fingerprint.hpp,
  // compared field by field; a load names the first field that differs and both values, and
  // refuses a context of an older fingerprint as such), or the caller's own "key=value" lines
  // (compared line by line, naming the first that differs).
  // What load_slot and inspect_saved_context return of a shard's record (CacheConfig::shard)
  // starts with the line naming the heads it holds, "kv_heads_held=[b, e) of M".
  std::string model;
};

// What a saved-context file holds, read from its headers alone (no rows are read).
struct SavedContextInfo {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;  // 0: head_dim (V rows the size of K rows)
  int max_seq = 0;
  DType dtype = DType::kBF16;
  std::vector<int> lengths;           // rows of each record (one record per saved slot)
  std::vector<SlotContext> contexts;  // tokens and fingerprint of each record
};
// Throws kvo::Error(kInvalidArgument) for a file that cannot be read or is not a saved context.
KVO_API SavedContextInfo inspect_saved_context(const std::string& path);

// A saved-context file opened once, with its headers read (no rows): its info() is what
// inspect_saved_context reports, and OffloadedStaticCache::load_slots reads the rows from the
// same open file, so that the path is opened and checked one time. Only a regular file is opened
// (never blocking on a FIFO or a device). Throws as inspect_saved_context. Move-only.
class KVO_API SavedContextFile {
 public:
  explicit SavedContextFile(const std::string& path,
                            ContextReading reading = ContextReading::kMapped);
  ~SavedContextFile();
  SavedContextFile(SavedContextFile&&) noexcept;
  SavedContextFile& operator=(SavedContextFile&&) noexcept;
  SavedContextFile(const SavedContextFile&) = delete;
  SavedContextFile& operator=(const SavedContextFile&) = delete;

  const SavedContextInfo& info() const;
  const std::string& path() const;

 private:
  friend class OffloadedStaticCache;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Refuses (kvo::Error kInvalidArgument, naming the path and the reason), before any work whose
// result would be saved, a path save_slots could not write: one that exists and is not a regular
// file (a save never replaces a device, a FIFO, a directory or a symbolic link), or whose
// directory is missing or takes no new files. Writes nothing.
KVO_API void check_save_path(const std::string& path);

class KVO_API OffloadedStaticCache {
 public:
  // Plans, allocates every device and host byte, and starts the copy streams.
  // Throws kvo::Error: kInvalidArgument for a bad config, kOutOfMemory when the plan does not
  // fit the budget (naming the missing bytes) or an allocation fails (naming its size),
  // kDevice when the CUDA backend was asked for and no device is usable.
  explicit OffloadedStaticCache(const CacheConfig& config);
  // Waits until the cache's copies and the work on every stream it made (the whole device, on
  // CUDA) are done, then frees everything. Never throws.
  ~OffloadedStaticCache();
  OffloadedStaticCache(const OffloadedStaticCache&) = delete;
  OffloadedStaticCache& operator=(const OffloadedStaticCache&) = delete;
  OffloadedStaticCache(OffloadedStaticCache&&) noexcept;
  OffloadedStaticCache& operator=(OffloadedStaticCache&&) noexcept;

  // REQUIRES: no step open; new_tokens.size() == slots; 0 <= n[s]; length(s) + n[s] <= max_seq.
  // With CacheConfig::split, a slot that appends one row splits its streamed layers at
  // split_rows(config.split, length(s)); the others do not split.
  void begin_step(const std::vector<std::int32_t>& new_tokens);
  // As above, with each slot's split row given (split attention, LayerView::split_rows) instead
  // of planned: the step prefetches rows [split_rows[s], length(s)) of each streamed layer, and
  // the prefetches it issues for the next step skip the same rows. Works under any
  // CacheConfig::split mode.
  // REQUIRES: split_rows.size() == slots; 0 <= split_rows[s] <= length(s); split_rows[s] == 0
  // unless new_tokens[s] == 1.
  void begin_step(const std::vector<std::int32_t>& new_tokens,
                  const std::vector<std::int32_t>& split_rows);
  // REQUIRES: a step is open; `layer` is the next layer of the step; no layer is held.
  LayerView acquire(int layer, void* stream = nullptr);
  // Copies `count` rows of K and of V for `slot`, each [count][kv_heads][head_dim] contiguous in
  // device memory (host memory on the host backend), to the slot's next free rows, ordered on
  // `stream`. The inputs must stay valid until that stream has executed the copy.
  // REQUIRES: `layer` is held; rows appended to `slot` in this layer stay <= new_tokens[slot].
  void append(int layer, int slot, const void* k_rows, const void* v_rows, int count,
              void* stream = nullptr);
  // REQUIRES: `layer` is held and every slot has all its new_tokens appended.
  void release(int layer, void* stream = nullptr);
  // REQUIRES: a step is open and every layer was released.
  void end_step();
  // Ends an open step without committing it: lengths stay as they were, the held layer (if any)
  // is given back (its buffer is reused only after `stream` has passed this call), and what was
  // prefetched is re-issued by the next begin_step. Waits on the host for the copy streams.
  // REQUIRES: `stream` is the stream the held layer was acquired and appended on.
  void abort_step(void* stream = nullptr);

  // Between steps only. truncate_slot refuses a length whose window rows a window layer no
  // longer holds (it keeps the last rows of each window), unless to 0. A change of length makes
  // the next begin_step issue again what the
  // previous step prefetched for it (its first ring_depth streamed layers, at the old length),
  // so the next step moves exactly its new prefixes; stats().prefetch_reissues counts them.
  void reset_slot(int slot);                 // length 0
  void truncate_slot(int slot, int length);  // REQUIRES: 0 <= length <= length(slot)
  // Slot s takes the rows and length slot source[s] held (beam search's reorder): every layer's
  // valid rows move in place where they live (a resident layer's device to device, a streamed
  // layer's within the host store), ordered so that no slot is written before its last reader,
  // a cycle through one slot's worth of scratch (a staging buffer, or host memory when nothing is
  // streamed): any mapping is safe (cycles, one source for many). Blocks until done.
  // source has one entry per slot, each a slot. Between steps only; stats().reorder_bytes
  // counts the rows written. Throws kvo::Error: kProtocol inside a step, kInvalidArgument for a
  // bad source (nothing changed).
  void reorder_slots(const std::vector<int>& source);
  int length(int slot) const;
  bool in_step() const;

  // Saved contexts, between steps only; not of a cache with window layers (refused, naming
  // them). A saved context is a slot's rows of every layer (from
  // the host store and the resident layers), its length, its SlotContext and the cache's shape
  // (layers, kv_heads, head_dim, K/V dtype, max_seq); each layer's rows carry an XXH3 checksum.
  // Both calls first wait until every copy in flight and the work on the callers' streams have
  // finished (the whole device, on CUDA).
  //
  // save: a file holds one record per slot, in the order given; it is written to a partial file
  // beside `path` ("<path>.kvo-partial-<pid>-XXXXXX"), synced and renamed, so `path` is either
  // the old file or the whole new one. A path that exists and is not a regular file is refused
  // (check_save_path); the partial file is removed on every failure, and partial files of killed
  // processes in that directory are removed by the next save there. A write past a file-size
  // limit is reported as EFBIG only where SIGXFSZ is ignored (else the system ends the process).
  // REQUIRES: contexts.size() == slots.size(); each tokens list empty or length(slot) long.
  void save_slot(int slot, const std::string& path, const SlotContext& context = {});
  void save_slots(const std::vector<int>& slots, const std::string& path,
                  const std::vector<SlotContext>& contexts);
  void save_slot(int slot, std::ostream& out, const SlotContext& context = {});
  // load: replaces each slot's rows and length with a record's, and returns its SlotContext.
  // Refused before anything changes (kvo::Error kInvalidArgument, naming the difference) when a
  // record was saved from another shape, dtype, max_seq or model fingerprint (`model`); refused
  // with the failing layer block named, leaving every slot as it was, when the input is
  // truncated or corrupted. A file must hold exactly slots.size() records. Rows go straight into
  // the host store for an empty slot; for a slot that holds rows they are staged in host memory
  // first (as many bytes as the record), so that a refusal leaves them as they were.
  // REQUIRES: the slots are distinct. Prefetches are re-issued as after truncate_slot.
  SlotContext load_slot(int slot, const std::string& path, const std::string& model = "");
  std::vector<SlotContext> load_slots(const std::vector<int>& slots, const std::string& path,
                                      const std::string& model = "");
  std::vector<SlotContext> load_slots(const std::vector<int>& slots, SavedContextFile& file,
                                      const std::string& model = "");
  SlotContext load_slot(int slot, std::istream& in, const std::string& model = "");

  CacheStats stats() const;
  const CacheConfig& config() const;
  BackendKind backend() const;
  // A caller region planned with the cache (CacheConfig::reserved). Throws for an unknown name.
  void* reserved(const std::string& name) const;

  // Stream helpers that work on both backends, for callers without their own runtime and for
  // tests: create_stream gives a cudaStream_t on CUDA, an asynchronous worker on the host (see
  // CacheStream below for one that frees itself).
  void* create_stream();
  // Waits for the stream's work, then frees it; nullptr is a no-op. Throws kvo::Error
  // (kInvalidArgument), and frees nothing, for a handle this cache did not make or has freed.
  void destroy_stream(void* stream);
  // Runs fn(arg) on `stream` after the work enqueued before it (cudaLaunchHostFunc on CUDA).
  // fn must not call into the cache, its backend or CUDA.
  void launch_host_func(void* stream, void (*fn)(void*), void* arg);
  void synchronize_stream(void* stream);
  // Host waits until every copy the cache issued has completed.
  void synchronize();
  // Blocking copies between host and device memory (device to host, host to device).
  void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes);
  void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A stream made by cache.create_stream(), owned: synchronized and destroyed with its owner, also
// while an exception unwinds. Move-only; empty (get() == nullptr) when default-made or moved from.
// REQUIRES: the cache outlives it.
class CacheStream {
 public:
  CacheStream() = default;
  explicit CacheStream(OffloadedStaticCache& cache)
      : cache_(&cache), stream_(cache.create_stream()) {}
  ~CacheStream() { reset(); }
  CacheStream(CacheStream&& other) noexcept : cache_(other.cache_), stream_(other.stream_) {
    other.stream_ = nullptr;
  }
  CacheStream& operator=(CacheStream&& other) noexcept {
    if (this != &other) {
      reset();
      cache_ = other.cache_;
      stream_ = other.stream_;
      other.stream_ = nullptr;
    }
    return *this;
  }
  CacheStream(const CacheStream&) = delete;
  CacheStream& operator=(const CacheStream&) = delete;
  void* get() const { return stream_; }
  void reset() noexcept {
    if (stream_ == nullptr) return;
    try {
      cache_->synchronize_stream(stream_);
    } catch (...) {
      // No caller to report to; the stream is destroyed regardless.
    }
    try {
      cache_->destroy_stream(stream_);
    } catch (...) {
      // Not reached: the stream is the cache's own.
    }
    stream_ = nullptr;
  }

 private:
  OffloadedStaticCache* cache_ = nullptr;
  void* stream_ = nullptr;
};

}  // namespace kvo
