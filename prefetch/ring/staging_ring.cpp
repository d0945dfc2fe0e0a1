#include "prefetch/ring/staging_ring.hpp"

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
  for (int s = 0; s < layout_.slots; ++s) {
    const std::int64_t rows = lengths_[s] + (next_step ? new_tokens_[s] : 0);
    if (rows == 0) continue;
    const std::uint64_t k = layout_.k_bytes(rows);
    const std::uint64_t v = layout_.v_bytes(rows);
    backend_.copy_async(buffer.base + layout_.k_offset(s, 0), store_.k(i, s), k, h2d);
    backend_.copy_async(buffer.base + layout_.v_begin() + layout_.v_offset(s, 0), store_.v(i, s), v,
                        h2d);
    bytes += k + v;
  }
  backend_.record(buffer.filled.get(), h2d);
  buffer.visit = q;
  (next_step ? h2d_next_step_ : h2d_this_step_) += bytes;
  counters_.h2d_bytes_total += bytes;
}

void StagingRing::begin_step(const std::int32_t* new_tokens) {
  new_tokens_ = new_tokens;
  if (issued_ < step_base()) issued_ = step_base();
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
