#include "prefetch/staging_ring.hpp"

#include "kvoffload/error.hpp"

namespace kvo::prefetch {

StagingRing::StagingRing(Backend& backend, offload::HostStore& store, offload::DeviceArena& arena,
                         const CachePlan& plan)
    : backend_(backend),
      store_(store),
      resident_(plan.resident_layers),
      streamed_(plan.streamed_layers),
      depth_(plan.ring_depth),
      slots_(store.slots()),
      max_seq_(store.max_seq()),
      row_bytes_(plan.row_bytes),
      tensor_bytes_(plan.tensor_bytes) {
  if (!(streamed_ > depth_ && depth_ >= 1)) {
    throw Error(ErrorCode::kInternal, "staging ring needs more streamed layers than buffers");
  }
  try {
    h2d_ = backend_.create_stream();
    d2h_ = backend_.create_stream();
    buffers_.resize(static_cast<std::size_t>(depth_));
    for (int b = 0; b < depth_; ++b) {
      Buffer& buffer = buffers_[static_cast<std::size_t>(b)];
      buffer.base = arena.staging_buffer(b);
      buffer.filled = backend_.create_event();
      buffer.released = backend_.create_event();
      buffer.written_back = backend_.create_event();
    }
    for (int i = 0; i < streamed_; ++i) layer_written_.push_back(backend_.create_event());
  } catch (...) {
    destroy_handles();  // a half-built ring: members are destroyed by the unwinding itself
    throw;
  }
}

StagingRing::~StagingRing() {
  try {
    drain();
  } catch (...) {
    // Nothing to report to from a destructor; the streams are destroyed below regardless.
  }
  destroy_handles();
}

void StagingRing::destroy_handles() noexcept {
  for (Buffer& buffer : buffers_) {
    backend_.destroy_event(buffer.filled);
    backend_.destroy_event(buffer.released);
    backend_.destroy_event(buffer.written_back);
  }
  buffers_.clear();
  for (EventHandle event : layer_written_) backend_.destroy_event(event);
  layer_written_.clear();
  backend_.destroy_stream(h2d_);
  backend_.destroy_stream(d2h_);
  h2d_ = d2h_ = nullptr;
}

void StagingRing::prefetch(std::int64_t q) {
  const int i = static_cast<int>(q % streamed_);
  const bool next_step = q >= step_base() + streamed_;
  Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];

  backend_.wait(h2d_, buffer.released);                              // write-after-read
  backend_.wait(h2d_, buffer.written_back);                          // lost write-back
  backend_.wait(h2d_, layer_written_[static_cast<std::size_t>(i)]);  // stale prefix
  std::uint64_t bytes = 0;
  for (int s = 0; s < slots_; ++s) {
    const std::int64_t rows = store_.length(s) + (next_step ? new_tokens_[s] : 0);
    if (rows == 0) continue;
    const std::size_t range = static_cast<std::size_t>(rows) * row_bytes_;
    const std::size_t slot_offset = static_cast<std::size_t>(s) * max_seq_ * row_bytes_;
    backend_.copy_async(buffer.base + slot_offset, store_.k(i, s), range, h2d_);
    backend_.copy_async(buffer.base + tensor_bytes_ + slot_offset, store_.v(i, s), range, h2d_);
    bytes += 2 * range;
  }
  backend_.record(buffer.filled, h2d_);
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
  backend_.wait_measured(stream, buffer.filled);  // read-before-filled
  return buffer.base;
}

void StagingRing::release(int streamed, StreamHandle stream) {
  const std::int64_t q = step_base() + streamed;
  Buffer& buffer = buffers_[static_cast<std::size_t>(q % depth_)];
  backend_.record(buffer.released, stream);

  // Write back only the rows this step appended: [length, length + n) of each slot.
  backend_.wait(d2h_, buffer.released);
  std::uint64_t bytes = 0;
  for (int s = 0; s < slots_; ++s) {
    if (new_tokens_[s] == 0) continue;
    const std::size_t range = static_cast<std::size_t>(new_tokens_[s]) * row_bytes_;
    const std::size_t row_offset =
        (static_cast<std::size_t>(s) * max_seq_ + static_cast<std::size_t>(store_.length(s))) *
        row_bytes_;
    const std::size_t host_offset = static_cast<std::size_t>(store_.length(s)) * row_bytes_;
    backend_.copy_async(store_.k(streamed, s) + host_offset, buffer.base + row_offset, range, d2h_);
    backend_.copy_async(store_.v(streamed, s) + host_offset,
                        buffer.base + tensor_bytes_ + row_offset, range, d2h_);
    bytes += 2 * range;
  }
  backend_.record(buffer.written_back, d2h_);
  backend_.record(layer_written_[static_cast<std::size_t>(streamed)], d2h_);
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
    backend_.record(buffers_[static_cast<std::size_t>(q % depth_)].released, stream);
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
  if (h2d_ != nullptr) backend_.synchronize_stream(h2d_);
  if (d2h_ != nullptr) backend_.synchronize_stream(d2h_);
}

}  // namespace kvo::prefetch
