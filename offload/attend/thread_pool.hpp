// One pool of threads for what the host computes (the host path's ops, split attention's host
// part). The caller and threads - 1 workers run the tasks of one parallel loop at a time; BLAS
// runs single-threaded inside those tasks, so the machine's cores are shared by one pool and never
// oversubscribed by it.
//
// Tasks are claimed one at a time from a shared counter, so which thread runs a task changes
// from run to run. A task's result must depend on its index alone (the thread number only names
// per-thread scratch): that keeps the host path deterministic. The caller waits for the tasks,
// never for a worker: a worker that the OS has not scheduled yet (a busy machine, or more
// threads than cores) leaves its share to the threads that run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvo::attend {

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
  // One parallel loop. Workers that wake late may still hold it after run() returned; they find
  // no task left and never touch `task` again.
  struct Loop {
    const std::function<void(int, int)>* task = nullptr;
    int count = 0;
    std::atomic<int> next{0};
    std::atomic<int> done{0};
    std::mutex error_mutex;
    std::exception_ptr error;
  };

  void work(int thread);
  void claim_tasks(Loop& loop, int thread);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;      // a new loop, or stop
  std::condition_variable finished_;  // the last task of the current loop finished
  std::atomic<std::uint64_t> generation_{0};
  std::shared_ptr<Loop> loop_;  // the current loop, under mutex_
  bool stop_ = false;           // under mutex_
};

}  // namespace kvo::attend
