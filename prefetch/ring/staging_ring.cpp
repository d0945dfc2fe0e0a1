#include "prefetch/ring/staging_ring.hpp"

#include <algorithm>

#include "kvoffload/error.hpp"

namespace kvo::prefetch {

StagingRing::StagingRing(Backend& backend, offload::HostStore& store, offload::DeviceArena& arena,
                         const CachePlan& plan, const std::int32_t* lengths)
    : backend_(backend),
      store_(store),
      layout_(plan.layout),
      lengths_(lengths),
      streamed_(plan.streamed_layers),
      depth_(plan.ring_depth) {
  if (!(streamed_ > depth_ && depth_ >= 1)) {
    throw Error(ErrorCode::kInternal, "staging ring needs more streamed layers than buffers");
  }
  h2d_ = Stream(backend_);
  d2h_ = Stream(backend_);
  buffers_.resize(static_cast<std::size_t>(depth_));
  for (int b = 0; b < depth_; ++b) {
    Buffer& buffer = buffers_[static_cast<std::size_t>(b)];
    buffer.base = arena.staging_buffer(b);
    buffer.filled = Event(backend_);
    buffer.released = Event(backend_);
    buffer.written_back = Event(backend_);
    buffer.from.assign(static_cast<std::size_t>(layout_.slots), 0);
  }
  for (int i = 0; i < streamed_; ++i) layer_written_.emplace_back(backend_);
}

StagingRing::~StagingRing() {
  try {
    drain();
  } catch (...) {
    // Nothing to report to from a destructor; the streams are destroyed regardless.
  }
}

void StagingRing::prefetch(std::int64_t q) {
  const int i = static_cast<int>(q % streamed_);
  const bool next_step = q >= step_base() + streamed_;
  Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];

  const StreamHandle h2d = h2d_.get();
  backend_.wait(h2d, buffer.released.get());                              // write-after-read
  backend_.wait(h2d, buffer.written_back.get());                          // lost write-back
  backend_.wait(h2d, layer_written_[static_cast<std::size_t>(i)].get());  // stale prefix
  std::uint64_t bytes = 0;
  const std::int32_t* split = next_step ? next_split_ : split_;
  for (int s = 0; s < layout_.slots; ++s) {
    const int rows = lengths_[s] + (next_step ? new_tokens_[s] : 0);
    const int from = split != nullptr ? std::min(split[s], rows) : 0;
    buffer.from[static_cast<std::size_t>(s)] = from;
    bytes += copy_rows(buffer, i, s, from, rows, h2d);
  }
  backend_.record(buffer.filled.get(), h2d);
  buffer.visit = q;
  (next_step ? h2d_next_step_ : h2d_this_step_) += bytes;
  counters_.h2d_bytes_total += bytes;
}

std::uint64_t StagingRing::copy_rows(const Buffer& buffer, int streamed, int slot, int from, int to,
                                     StreamHandle h2d) {
  if (to <= from) return 0;
  const std::uint64_t k = layout_.k_bytes(to - from);
  const std::uint64_t v = layout_.v_bytes(to - from);
  backend_.copy_async(buffer.base + layout_.k_offset(slot, from),
                      store_.k(streamed, slot) + layout_.k_offset(0, from), k, h2d);
  backend_.copy_async(buffer.base + layout_.v_begin() + layout_.v_offset(slot, from),
                      store_.v(streamed, slot) + layout_.v_offset(0, from), v, h2d);
  return k + v;
}

void StagingRing::begin_step(const std::int32_t* new_tokens, const std::int32_t* split,
                             const std::int32_t* next_split) {
  new_tokens_ = new_tokens;
  split_ = split;
  next_split_ = next_split;
  if (issued_ < step_base()) issued_ = step_base();
  // Prefetches issued during the previous step skipped the rows its guess left on the host;
  // where this step leaves fewer there, the rows between come now, on the same stream.
  for (std::int64_t q = step_base(); q < issued_; ++q) {
    Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];
    std::uint64_t bytes = 0;
    for (int s = 0; s < layout_.slots; ++s) {
      std::int32_t& from = buffer.from[static_cast<std::size_t>(s)];
      const int need = split != nullptr ? std::min(split[s], from) : 0;
      bytes += copy_rows(buffer, static_cast<int>(q % streamed_), s, need, from, h2d_.get());
      from = need;
    }
    if (bytes == 0) continue;
    backend_.record(buffer.filled.get(), h2d_.get());
    h2d_this_step_ += bytes;
    counters_.h2d_bytes_total += bytes;
  }
  for (; issued_ < step_base() + depth_; ++issued_) prefetch(issued_);
}

std::byte* StagingRing::acquire(int streamed, StreamHandle stream) {
  const std::int64_t q = step_base() + streamed;
  Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];
  if (buffer.visit != q) {
    throw Error(ErrorCode::kInternal, "staging buffer does not hold the layer being acquired");
  }
  backend_.wait_measured(stream, buffer.filled.get());  // read-before-filled
  return buffer.base;
}

void StagingRing::release(int streamed, StreamHandle stream) {
  const std::int64_t q = step_base() + streamed;
  Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];
  backend_.record(buffer.released.get(), stream);

  // Write back only the rows this step appended: [length, length + n) of each slot.
  const StreamHandle d2h = d2h_.get();
  backend_.wait(d2h, buffer.released.get());
  std::uint64_t bytes = 0;
  for (int s = 0; s < layout_.slots; ++s) {
    const int n = new_tokens_[s];
    if (n == 0) continue;
    const int length = lengths_[s];
    const std::uint64_t k = layout_.k_bytes(n);
    const std::uint64_t v = layout_.v_bytes(n);
    backend_.copy_async(store_.k(streamed, s) + layout_.k_offset(0, length),
                        buffer.base + layout_.k_offset(s, length), k, d2h);
    backend_.copy_async(store_.v(streamed, s) + layout_.v_offset(0, length),
                        buffer.base + layout_.v_begin() + layout_.v_offset(s, length), v, d2h);
    bytes += k + v;
  }
  backend_.record(buffer.written_back.get(), d2h);
  backend_.record(layer_written_[static_cast<std::size_t>(streamed)].get(), d2h);
  d2h_this_step_ += bytes;
  counters_.d2h_bytes_total += bytes;

  if (issued_ == q + depth_) prefetch(issued_++);
}

void StagingRing::end_step() {
  ++step_;
  counters_.h2d_bytes_last_step = h2d_this_step_;
  counters_.d2h_bytes_last_step = d2h_this_step_;
  h2d_this_step_ = h2d_next_step_;
  h2d_next_step_ = 0;
  d2h_this_step_ = 0;
}

void StagingRing::abort_step(int held_streamed, StreamHandle stream) {
  if (held_streamed >= 0) {
    const std::int64_t q = step_base() + held_streamed;
    backend_.record(buffers_[static_cast<std::size_t>(q % depth_)].released.get(), stream);
  }
  drain();
  forget_prefetches();
  h2d_next_step_ = 0;
  d2h_this_step_ = 0;
}

void StagingRing::forget_prefetches() {
  if (issued_ <= step_base()) return;
  counters_.prefetch_reissues += static_cast<std::uint64_t>(issued_ - step_base());
  issued_ = step_base();
  h2d_this_step_ = 0;  // those bytes stay in the totals; the step will count its own
}

void StagingRing::drain() {
  if (h2d_.get() != nullptr) backend_.synchronize_stream(h2d_.get());
  if (d2h_.get() != nullptr) backend_.synchronize_stream(d2h_.get());
}

}  // namespace kvo::prefetch
