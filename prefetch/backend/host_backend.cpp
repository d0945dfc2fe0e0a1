#include "prefetch/backend/host_backend.hpp"

#include <boost/lockfree/spsc_queue.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/util/host_pages.hpp"

namespace kvo::prefetch {

namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t elapsed_ns(Clock::time_point since) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

std::size_t round_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace

// An event is a counter of records and a counter of completions. wait(gen) blocks until the
// record numbered gen has completed. Each event is recorded on one stream at a time (the
// schedule never records one event on two streams concurrently), so completions are in order.
class HostEvent {
 public:
  std::uint64_t next_record() { return ++recorded_; }
  std::uint64_t last_record() const { return recorded_.load(); }

  // Notifies under the lock: a waiter may destroy the event as soon as it sees the completion.
  void complete(std::uint64_t gen) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gen > completed_) completed_ = gen;
    cv_.notify_all();
  }
  void wait_for(std::uint64_t gen) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return completed_ >= gen; });
  }

 private:
  std::atomic<std::uint64_t> recorded_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t completed_ = 0;
};

struct StreamOp {
  enum class Kind : std::uint8_t { kCopy, kSignal, kWait, kWaitMeasured, kFunc };
  Kind kind = Kind::kCopy;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  HostEvent* event = nullptr;
  std::uint64_t gen = 0;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
};

// One worker thread executing ops in order. The thread that calls into the cache is the only
// producer; the worker is the only consumer.
class HostStream {
 public:
  HostStream(std::uint32_t max_delay_us, std::uint64_t seed, std::atomic<std::uint64_t>* copied,
             std::atomic<std::uint64_t>* stall_ns)
      : max_delay_us_(max_delay_us),
        rng_(seed),
        copied_(copied),
        stall_ns_(stall_ns),
        worker_([this] { run(); }) {}

  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }

  void push(const StreamOp& op) {
    while (!queue_.push(op)) std::this_thread::yield();  // full: the worker is draining it
    { std::lock_guard<std::mutex> lock(mutex_); }        // pairs with the worker's check below
    cv_.notify_one();
  }

 private:
  void run() {
    StreamOp op;
    for (;;) {
      if (queue_.pop(op)) {
        execute(op);
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || queue_.read_available() > 0; });
      if (stop_ && queue_.read_available() == 0) return;
    }
  }

  void delay() {
    if (max_delay_us_ == 0) return;
    std::uniform_int_distribution<std::uint32_t> draw(0, max_delay_us_);
    std::this_thread::sleep_for(std::chrono::microseconds(draw(rng_)));
  }

  void execute(const StreamOp& op) {
    switch (op.kind) {
      case StreamOp::Kind::kCopy:
        delay();
        std::memcpy(op.dst, op.src, op.bytes);
        copied_->fetch_add(op.bytes);
        break;
      case StreamOp::Kind::kSignal:
        op.event->complete(op.gen);
        break;
      case StreamOp::Kind::kWait:
        op.event->wait_for(op.gen);
        break;
      case StreamOp::Kind::kWaitMeasured: {
        const auto start = Clock::now();
        op.event->wait_for(op.gen);
        stall_ns_->fetch_add(elapsed_ns(start));
        break;
      }
      case StreamOp::Kind::kFunc:
        delay();
        try {
          op.fn(op.arg);
        } catch (...) {
          // A host function must not throw; there is no caller to hand the error to.
        }
        break;
    }
  }

  static constexpr std::size_t kQueueCapacity = 4096;
  boost::lockfree::spsc_queue<StreamOp, boost::lockfree::capacity<kQueueCapacity>> queue_;
  std::uint32_t max_delay_us_;
  std::mt19937_64 rng_;
  std::atomic<std::uint64_t>* copied_;
  std::atomic<std::uint64_t>* stall_ns_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread worker_;  // last: starts once everything above is built
};

namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

std::uint64_t HostBackend::allocations_in_process() {
  return g_allocations.load();
}

HostBackend::HostBackend(const HostBackendOptions& options, std::uint64_t device_capacity)
    : options_(options), device_capacity_(device_capacity) {}

HostBackend::~HostBackend() {
  std::set<HostStream*> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams.swap(streams_);
  }
  for (HostStream* stream : streams) delete stream;
}

void* HostBackend::alloc_device(std::size_t bytes) {
  const std::size_t rounded = round_up(bytes == 0 ? 1 : bytes, 256);
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t in_use = ledger_.counters().device_bytes;
  if (device_capacity_ != 0 && in_use + rounded > device_capacity_) {
    throw Error(ErrorCode::kOutOfMemory, "host backend: device allocation of " +
                                             format_bytes(rounded) + " exceeds the " +
                                             format_bytes(device_capacity_) + " arena (" +
                                             format_bytes(in_use) + " in use)");
  }
  void* ptr = allocate_host_pages(rounded, 256);
  if (ptr == nullptr) {
    throw Error(ErrorCode::kOutOfMemory,
                "host backend: could not allocate " + format_bytes(rounded) + " of device memory");
  }
  std::memset(ptr, 0, rounded);
  ledger_.add(ptr, rounded, offload::AllocationLedger::Kind::kDevice);
  g_allocations.fetch_add(1);
  return ptr;
}

void HostBackend::free_device(void* ptr) noexcept {
  if (ptr == nullptr) return;
  ledger_.remove(ptr);
  std::free(ptr);
}

void* HostBackend::alloc_host(std::size_t bytes) {
  const std::size_t rounded = round_up(bytes == 0 ? 1 : bytes, 4096);
  void* ptr = allocate_host_pages(rounded, 4096);
  if (ptr == nullptr) {
    throw Error(ErrorCode::kOutOfMemory,
                "could not allocate " + format_bytes(rounded) +
                    " of host memory for the KV store; lower max_seq or slots");
  }
  ledger_.add(ptr, rounded, offload::AllocationLedger::Kind::kHost);
  g_allocations.fetch_add(1);
  return ptr;
}

void HostBackend::free_host(void* ptr) noexcept {
  if (ptr == nullptr) return;
  ledger_.remove(ptr);
  std::free(ptr);
}

std::uint64_t HostBackend::device_free_bytes() {
  if (device_capacity_ == 0) return UINT64_MAX;
  return device_capacity_ - ledger_.counters().device_bytes;
}

StreamHandle HostBackend::create_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t index = streams_made_++;
  auto* stream =
      new HostStream(options_.max_delay_us, options_.delay_seed * 0x9E3779B97F4A7C15ull + index + 1,
                     &copied_bytes_, &stall_ns_);
  streams_.insert(stream);
  return stream;
}

bool HostBackend::destroy_stream(StreamHandle stream) noexcept {
  if (stream == nullptr) return true;
  HostStream* host_stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(static_cast<HostStream*>(stream));
    if (it == streams_.end()) return false;
    host_stream = *it;
    streams_.erase(it);
  }
  delete host_stream;  // drains what was enqueued, then joins
  return true;
}

EventHandle HostBackend::create_event() {
  return new HostEvent();
}

void HostBackend::destroy_event(EventHandle event) noexcept {
  delete static_cast<HostEvent*>(event);
}

HostStream* HostBackend::async_stream(StreamHandle stream) const {
  if (stream == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(static_cast<HostStream*>(stream));
  if (it == streams_.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "stream handle is not a stream of this host-backend cache (destroyed, made by "
                "another cache, or a CUDA stream): pass nullptr or a stream from create_stream");
  }
  return *it;
}

void HostBackend::copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  check_disjoint(dst, src, bytes);
  if (HostStream* host_stream = async_stream(stream)) {
    StreamOp op;
    op.kind = StreamOp::Kind::kCopy;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    host_stream->push(op);
    return;
  }
  std::memcpy(dst, src, bytes);
  copied_bytes_.fetch_add(bytes);
}

void HostBackend::record(EventHandle event, StreamHandle stream) {
  auto* host_event = static_cast<HostEvent*>(event);
  const std::uint64_t gen = host_event->next_record();
  if (HostStream* host_stream = async_stream(stream)) {
    StreamOp op;
    op.kind = StreamOp::Kind::kSignal;
    op.event = host_event;
    op.gen = gen;
    host_stream->push(op);
    return;
  }
  host_event->complete(gen);  // the calling thread has already done everything before this
}

void HostBackend::wait_impl(StreamHandle stream, EventHandle event, bool measured) {
  auto* host_event = static_cast<HostEvent*>(event);
  const std::uint64_t gen = host_event->last_record();
  if (gen == 0) return;  // never recorded: nothing to wait for (as in CUDA)
  if (HostStream* host_stream = async_stream(stream)) {
    StreamOp op;
    op.kind = measured ? StreamOp::Kind::kWaitMeasured : StreamOp::Kind::kWait;
    op.event = host_event;
    op.gen = gen;
    host_stream->push(op);
    return;
  }
  const auto start = Clock::now();
  host_event->wait_for(gen);
  if (measured) stall_ns_.fetch_add(elapsed_ns(start));
}

void HostBackend::wait(StreamHandle stream, EventHandle event) {
  wait_impl(stream, event, false);
}

void HostBackend::wait_measured(StreamHandle stream, EventHandle event) {
  wait_impl(stream, event, true);
}

void HostBackend::synchronize_event(EventHandle event) {
  auto* host_event = static_cast<HostEvent*>(event);
  host_event->wait_for(host_event->last_record());
}

void HostBackend::synchronize_stream(StreamHandle stream) {
  if (async_stream(stream) == nullptr) return;
  HostEvent drained;
  record(&drained, stream);
  synchronize_event(&drained);
}

void HostBackend::synchronize_all() {
  std::vector<HostStream*> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams.assign(streams_.begin(), streams_.end());
  }
  for (HostStream* stream : streams) synchronize_stream(stream);
}

void HostBackend::launch_host_func(StreamHandle stream, void (*fn)(void*), void* arg) {
  if (HostStream* host_stream = async_stream(stream)) {
    StreamOp op;
    op.kind = StreamOp::Kind::kFunc;
    op.fn = fn;
    op.arg = arg;
    host_stream->push(op);
    return;
  }
  fn(arg);
}

void HostBackend::copy_sync(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

double HostBackend::stall_seconds() {
  return static_cast<double>(stall_ns_.load()) * 1e-9;
}

MemoryCounters HostBackend::memory() const {
  return ledger_.counters();
}

}  // namespace kvo::prefetch
