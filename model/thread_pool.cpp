#include "model/thread_pool.hpp"

#include <sched.h>

#include <stdexcept>

namespace kvo::model {
namespace {

// A worker that finished a loop polls for the next one this many times before it sleeps: a
// decode step runs hundreds of short loops back to back, and a wake-up through the kernel costs
// more than most of them.
constexpr int kSpins = 20000;

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

void ThreadPool::claim_tasks(int thread) {
  for (int i = next_.fetch_add(1, std::memory_order_relaxed); i < count_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    try {
      (*task_)(i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::run(int count, const std::function<void(int, int)>& task) {
  if (count <= 0) return;
  if (workers_.empty() || count == 1) {
    for (int i = 0; i < count; ++i) task(i, 0);
    return;
  }
  task_ = &task;
  count_ = count;
  error_ = nullptr;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  claim_tasks(0);
  for (int spin = 0; spin < kSpins && busy_.load(std::memory_order_acquire) != 0; ++spin) {
    cpu_relax();
  }
  if (busy_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return busy_.load(std::memory_order_acquire) == 0; });
  }
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::work(int thread) {
  std::uint64_t seen = 0;
  for (;;) {
    for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
      cpu_relax();
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    claim_tasks(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      idle_.notify_one();
    }
  }
}

}  // namespace kvo::model
