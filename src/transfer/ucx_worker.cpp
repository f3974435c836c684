#include "transfer/ucx_worker.h"

#include <poll.h>
#include <ucs/config/global_opts.h>

#include <cstdlib>

namespace zest::transfer {
namespace {

// How long the progress thread waits on the event fd before it looks again (expiry sweeps, stop requests, and a
// safety net for a transport that misses a wake-up).
constexpr int kPollMs = 10;
// Rounds of ucp_worker_progress per hold of the mutex before other threads get a turn.
constexpr int kProgressBurst = 64;

// UCX logs errors of its own for what zest reports as a Status anyway (a read from an offerer that went away logs
// "connect(...) failed: Connection refused" at error level): only fatal ones unless the user set UCX_LOG_LEVEL.
void quiet_ucx_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("UCX_LOG_LEVEL") == nullptr) (void)ucs_global_opts_set_value("LOG_LEVEL", "fatal");
  });
}

}  // namespace

std::string to_hex(const void* data, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string s(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 15];
  }
  return s;
}

bool from_hex(const std::string& hex, std::vector<uint8_t>& out) {
  if (hex.size() % 2 != 0) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out.resize(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::string ucx_error(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::create(const char* name, const std::vector<AmHandler>& handlers) {
  quiet_ucx_logs();
  std::unique_ptr<UcxWorker> w(new UcxWorker());

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return internal_error(ucx_error("ucp_config_read", st));
  // The user's UCX_TLS wins; otherwise no shared-memory transports (see kv_transfer.h).
  if (std::getenv("UCX_TLS") == nullptr) st = ucp_config_modify(config, "TLS", kDefaultTls);
  if (st != UCS_OK) {
    ucp_config_release(config);
    return internal_error(ucx_error("ucp_config_modify(TLS)", st));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = name;
  st = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    w->context_ = nullptr;
    return internal_error(ucx_error("ucp_init", st));
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  wp.name = name;
  st = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (st != UCS_OK) {
    w->worker_ = nullptr;
    return internal_error(ucx_error("ucp_worker_create", st));
  }
  st = ucp_worker_get_efd(w->worker_, &w->efd_);
  if (st != UCS_OK) return internal_error(ucx_error("ucp_worker_get_efd", st));

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  st = ucp_worker_get_address(w->worker_, &address, &address_len);
  if (st != UCS_OK) return internal_error(ucx_error("ucp_worker_get_address", st));
  w->address_hex_ = to_hex(address, address_len);
  ucp_worker_release_address(w->worker_, address);

  for (const AmHandler& h : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = h.id;
    hp.cb = h.cb;
    hp.arg = h.arg;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(w->worker_, &hp);
    if (st != UCS_OK) return internal_error(ucx_error("ucp_worker_set_am_recv_handler", st));
  }
  return w;
}

UcxWorker::~UcxWorker() {
  stop();
  destroy_worker();
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxWorker::start(std::function<void()> after_progress) {
  after_progress_ = std::move(after_progress);
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void UcxWorker::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop_ = true;
    signal();
  }
  thread_.join();
}

void UcxWorker::destroy_worker() {
  if (worker_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    ucp_worker_destroy(worker_);  // may complete requests (with `mu` held, as callbacks expect)
    worker_ = nullptr;
  }
  // Operations UCX never completed: their requests went with the worker, their state goes here.
  for (Pending* p : pending_) delete p;
  pending_.clear();
}

void UcxWorker::signal() {
  if (worker_ != nullptr) (void)ucp_worker_signal(worker_);
}

void UcxWorker::loop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stop_) {
    int rounds = 0;
    while (rounds < kProgressBurst && ucp_worker_progress(worker_) != 0) ++rounds;
    if (after_progress_) after_progress_();
    if (rounds == kProgressBurst) {  // still busy: let the other threads in, then go on
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    ucs_status_t st = ucp_worker_arm(worker_);
    lock.unlock();
    if (st == UCS_ERR_BUSY) {  // events arrived since the last progress
      std::this_thread::yield();
    } else {
      pollfd pfd{efd_, POLLIN, 0};
      (void)poll(&pfd, 1, kPollMs);
    }
    lock.lock();
  }
}

void UcxWorker::progress_until(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
                               Clock::time_point deadline) {
  (void)lock;  // held by the caller
  while (!done() && Clock::now() < deadline) {
    if (ucp_worker_progress(worker_) != 0) continue;
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    pollfd pfd{efd_, POLLIN, 0};
    (void)poll(&pfd, 1, 1);
  }
}

void UcxWorker::on_send_done(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  p->owner->pending_.erase(p);
  p->complete(status);
  delete p;
  ucp_request_free(request);
}

ucs_status_t UcxWorker::post(std::unique_ptr<Pending> p,
                             const std::function<ucs_status_ptr_t(const ucp_request_param_t&)>& op) {
  p->owner = this;
  Pending* raw = p.release();
  pending_.insert(raw);  // before the call: UCX may complete it from then on
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxWorker::on_send_done;
  param.user_data = raw;
  ucs_status_ptr_t r = op(param);
  if (UCS_PTR_IS_PTR(r)) return UCS_OK;  // the callback completes it
  // Done at once (NULL) or failed at once: UCX calls no callback.
  ucs_status_t st = UCS_PTR_STATUS(r);
  pending_.erase(raw);
  raw->complete(st);
  delete raw;
  return st;
}

}  // namespace zest::transfer
