#include "core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace zest {
namespace {

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
    size_ = n;
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  // Runs task(i) for i in [0, count) with count <= size(); the caller runs index 0.
  void run(int count, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> call_lock(call_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      task_ = &task;
      count_ = count;
      pending_ = count - 1;
      ++generation_;
    }
    cv_.notify_all();
    task(0);
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int idx) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (idx >= count_) continue;
        task = task_;
      }
      (*task)(idx);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  int size_ = 1;
  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int count_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int g_requested = 0;
Pool& pool() {
  static Pool p(g_requested > 0 ? g_requested
                                : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  return p;
}
thread_local bool t_inside = false;

}  // namespace

void set_num_threads(int n) { g_requested = n; }
int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  if (chunks <= 1 || t_inside) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  pool().run(static_cast<int>(chunks), [&](int i) {
    t_inside = true;
    const int64_t b = i * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
    t_inside = false;
  });
}

}  // namespace zest
