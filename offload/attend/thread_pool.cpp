#include "offload/attend/thread_pool.hpp"

#include <sched.h>

#include <stdexcept>

namespace kvo::attend {
namespace {

// A worker that finished a loop polls for the next one this many times before it sleeps, and the
// caller polls as long for the last task: a decode step runs hundreds of short loops back to
// back, and a wake-up through the kernel costs more than most of them.
constexpr int kSpins = 4000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) throw std::invalid_argument("a thread pool needs at least one thread");
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::claim_tasks(Loop& loop, int thread) {
  for (int i = loop.next.fetch_add(1, std::memory_order_relaxed); i < loop.count;
       i = loop.next.fetch_add(1, std::memory_order_relaxed)) {
    try {
      (*loop.task)(i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(loop.error_mutex);
      if (!loop.error) loop.error = std::current_exception();
    }
    if (loop.done.fetch_add(1, std::memory_order_acq_rel) + 1 == loop.count && thread != 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.notify_all();
    }
  }
}

void ThreadPool::run(int count, const std::function<void(int, int)>& task) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    std::exception_ptr error;
    for (int i = 0; i < count; ++i) {
      try {
        task(i, 0);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  auto loop = std::make_shared<Loop>();
  loop->task = &task;
  loop->count = count;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop_ = loop;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  claim_tasks(*loop, 0);
  for (int spin = 0; spin < kSpins && loop->done.load(std::memory_order_acquire) != count; ++spin) {
    cpu_relax();
  }
  if (loop->done.load(std::memory_order_acquire) != count) {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return loop->done.load(std::memory_order_acquire) == count; });
  }
  if (loop->error) std::rethrow_exception(loop->error);
}

void ThreadPool::work(int thread) {
  std::uint64_t seen = 0;
  for (;;) {
    for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
      cpu_relax();
    }
    std::shared_ptr<Loop> loop;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      loop = loop_;
    }
    if (loop) claim_tasks(*loop, thread);
  }
}

}  // namespace kvo::attend
