// StagingRing: the per-step schedule for the streamed layers. D staging buffers rotate over the
// sequence of streamed-layer visits q = step * S + i (S streamed layers, visit i of a step);
// visit q uses buffer q % D. Releasing visit q refills its buffer with visit q + D, which
// crosses into the next step near the end of one, so the first layers of a step do not stall.
//
// Events rule out the four hazards, never a sleep or a device-wide sync:
//   read-before-filled  acquire makes the caller's stream wait `filled[b]` (H2D done);
//   write-after-read    a prefetch into b waits `released[b]` (caller's work on b enqueued);
//   lost write-back     a prefetch into b waits `written_back[b]` (b's new rows on the host);
//   stale prefix        a prefetch of layer i waits `layer_written[i]` (i's last write-back).
#pragma once

#include <cstdint>
#include <vector>

#include "kvoffload/plan.hpp"
#include "offload/store/device_arena.hpp"
#include "offload/store/host_store.hpp"
#include "prefetch/backend/backend.hpp"

namespace kvo::prefetch {

struct RingCounters {
  std::uint64_t h2d_bytes_total = 0;
  std::uint64_t d2h_bytes_total = 0;
  std::uint64_t h2d_bytes_last_step = 0;
  std::uint64_t d2h_bytes_last_step = 0;
  std::uint64_t prefetch_reissues = 0;
};

class StagingRing {
 public:
  // REQUIRES: plan.streamed_layers > plan.ring_depth >= 1. `lengths` [slots]: the committed
  // length of each slot, owned by the cache, read when prefetches and write-backs are issued.
  StagingRing(Backend& backend, offload::HostStore& store, offload::DeviceArena& arena,
              const CachePlan& plan, const std::int32_t* lengths);
  // Waits for the copy streams; the events and streams then free themselves. Never throws.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Issues whatever prefetches of the step's first D visits are not in flight yet.
  // `new_tokens` (n[s] for each slot) stays valid and unchanged until end_step or abort_step.
  // Split attention: slot s's rows [0, split[s]) are not needed on the device this step, and
  // the prefetches issued during it for the next step skip [0, next_split[s]) (the cache's guess
  // of the next step's split). A prefetch already issued that skipped more rows than this step
  // allows gets them now (the buffer's fill event recorded again after them). Both arrays are
  // the cache's, valid and unchanged until end_step or abort_step; null: no split.
  void begin_step(const std::int32_t* new_tokens, const std::int32_t* split = nullptr,
                  const std::int32_t* next_split = nullptr);
  // Makes `stream` wait until streamed layer `streamed` is on the device; returns its buffer
  // (K, then V at + tensor_bytes).
  std::byte* acquire(int streamed, StreamHandle stream);  // K; V at + layout.v_begin()
  // Records that the caller's work on the buffer is enqueued on `stream`, writes the step's
  // new rows back to the host and refills the buffer with the visit D ahead.
  void release(int streamed, StreamHandle stream);
  void end_step();
  // Forgets the open step: waits on the host for the copy streams, and makes the next
  // begin_step issue its prefetches again. `stream` is where the caller last used a buffer.
  void abort_step(int held_streamed, StreamHandle stream);
  // Between steps: what was prefetched for the next step is issued again by its begin_step,
  // after a host-side change (reset, truncate). No wait: the H2D stream is in order, and
  // acquire waits on the latest fill of a buffer.
  void forget_prefetches();
  // Host waits until every copy issued so far has completed.
  void drain();
  // Host waits until streamed layer `streamed`'s last write-back has reached the host store
  // (before the host reads its rows in place).
  void wait_written(int streamed) {
    backend_.synchronize_event(layer_written_[static_cast<std::size_t>(streamed)].get());
  }

  const RingCounters& counters() const { return counters_; }

 private:
  struct Buffer {
    std::byte* base = nullptr;  // one layer by the plan's KvLayout: K, then V
    Event filled;
    Event released;
    Event written_back;
    std::int64_t visit = -1;         // the visit whose prefetch it holds (or receives)
    std::vector<std::int32_t> from;  // [slots]: the first row that prefetch copied
  };

  // Prefetches visit q into buffer q % D: rows [split, length) of every slot, where length is
  // the committed length for the current step and length + n for the next one, and split the
  // step's (or the next step's) split row, 0 without a split.
  void prefetch(std::int64_t q);
  std::int64_t step_base() const { return step_ * streamed_; }
  // Copies rows [from, to) of `slot` of streamed layer `streamed` into `buffer` on `h2d`;
  // returns the bytes.
  std::uint64_t copy_rows(const Buffer& buffer, int streamed, int slot, int from, int to,
                          StreamHandle h2d);

  Backend& backend_;
  offload::HostStore& store_;
  KvLayout layout_;
  const std::int32_t* lengths_;
  int streamed_;
  int depth_;
  // Declared before the events, destroyed after them (once drained).
  Stream h2d_;
  Stream d2h_;
  std::vector<Buffer> buffers_;
  std::vector<Event> layer_written_;  // per streamed layer
  const std::int32_t* new_tokens_ = nullptr;
  const std::int32_t* split_ = nullptr;
  const std::int32_t* next_split_ = nullptr;
  std::int64_t step_ = 0;    // the open (or next) step
  std::int64_t issued_ = 0;  // visits [0, issued_) have had their prefetch issued
  std::uint64_t h2d_this_step_ = 0;
  std::uint64_t h2d_next_step_ = 0;
  std::uint64_t d2h_this_step_ = 0;
  RingCounters counters_;
};

}  // namespace kvo::prefetch
