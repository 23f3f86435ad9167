// TaskThreads: a fixed set of threads that run the tasks handed to them, in
// order; the threads are joined in the destructor, after the tasks queued
// before it have run. (A std::mutex and condition variable rather than
// absl::Mutex::Await, whose conditions ThreadSanitizer cannot follow.)
// Run() is thread-safe.
#ifndef MONSOON_SERVER_TASK_THREADS_H_
#define MONSOON_SERVER_TASK_THREADS_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace monsoon::server {

class TaskThreads {
 public:
  explicit TaskThreads(int threads) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] { Serve(); });
    }
  }
  ~TaskThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  int size() const { return static_cast<int>(threads_.size()); }
  void Run(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
  }

 private:
  void Serve() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace monsoon::server

#endif  // MONSOON_SERVER_TASK_THREADS_H_
