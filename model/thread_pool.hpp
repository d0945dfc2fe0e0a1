// One pool of threads for the host path. The caller and threads - 1 workers run the tasks of one
// parallel loop at a time; BLAS runs single-threaded inside those tasks, so the machine's cores
// are shared by one pool and never oversubscribed.
//
// Tasks are claimed in index order from a shared counter, so which thread runs a task changes
// from run to run. A task's result must depend on its index alone (the thread number only names
// per-thread scratch): that keeps the host path deterministic.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvo::model {

// The cores this process may run on (its CPU affinity), at least 1.
int available_cores();

class ThreadPool {
 public:
  // REQUIRES: threads >= 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(index, thread) for every index in [0, count), thread in [0, threads()), and
  // returns when all have finished. Rethrows the first exception a task threw (the other tasks
  // still run). Not reentrant: a task must not call run().
  void run(int count, const std::function<void(int, int)>& task);

 private:
  void work(int thread);
  void claim_tasks(int thread);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;  // a new loop, or stop
  std::condition_variable idle_;  // the last worker left the loop
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> next_{0};
  std::atomic<int> busy_{0};  // workers still inside the current loop
  const std::function<void(int, int)>* task_ = nullptr;
  int count_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kvo::model
