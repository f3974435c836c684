// The UCX plumbing under kv_transfer.h: one UCP context and worker with its progress thread.
//
// The worker runs in UCS_THREAD_MODE_SERIALIZED and every call on it is made with `mu` held: the progress thread holds
// it while it progresses (so every UCX callback runs with `mu` held and must not take it), and releases it while it
// waits on the worker's event fd (ucp_worker_arm + poll with a short timeout). A thread that starts an operation
// calls signal() so that the progress thread wakes up for it.
#pragma once
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/status.h"

namespace zest::transfer {

// The transports used when UCX_TLS is not set: every transport but the shared-memory ones.
inline constexpr const char* kDefaultTls = "^sm";

std::string to_hex(const void* data, size_t size);
// False for an odd length or a character that is not a hex digit.
bool from_hex(const std::string& hex, std::vector<uint8_t>& out);
// "<function>: <UCX's status string>".
std::string ucx_error(const char* what, ucs_status_t status);

class UcxWorker {
 public:
  using Clock = std::chrono::steady_clock;
  // An operation in flight: UCX calls complete() (with `mu` held) once, and the worker deletes it then, or at
  // destruction when UCX never completed it.
  struct Pending {
    virtual ~Pending() = default;
    virtual void complete(ucs_status_t) {}
    UcxWorker* owner = nullptr;  // set by post()
  };
  struct AmHandler {
    unsigned id;
    ucp_am_recv_callback_t cb;
    void* arg;
  };

  // name: the UCX context and worker name. Active-message handlers are installed before the thread starts.
  static Result<std::unique_ptr<UcxWorker>> create(const char* name, const std::vector<AmHandler>& handlers);
  ~UcxWorker();  // stop(), destroy_worker(), then the context

  // Starts the progress thread; after_progress runs on it (with `mu` held) after each round of progress.
  void start(std::function<void()> after_progress);
  // Stops and joins the progress thread. Call without `mu`.
  void stop();
  // Destroys the worker (and with it every endpoint and request); the context stays for ucp_mem_unmap. After stop().
  void destroy_worker();

  // With `mu` held: wakes the progress thread.
  void signal();
  // With `mu` held and the progress thread stopped: progresses until done() or the deadline.
  void progress_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
                      Clock::time_point deadline);

  // With `mu` held: starts an operation (op calls UCX's *_nbx with the request parameters it is given, whose callback
  // completes p), or completes p at once when UCX finished it or failed at once; returns that immediate error.
  ucs_status_t post(std::unique_ptr<Pending> p, const std::function<ucs_status_ptr_t(const ucp_request_param_t&)>& op);

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address_hex() const { return address_hex_; }

  mutable std::mutex mu;
  std::condition_variable cv;  // notified by callbacks (with `mu` held)

 private:
  UcxWorker() = default;
  void loop();
  static void on_send_done(void* request, ucs_status_t status, void* user_data);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_hex_;
  std::unordered_set<Pending*> pending_;  // guarded by mu
  std::function<void()> after_progress_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace zest::transfer
