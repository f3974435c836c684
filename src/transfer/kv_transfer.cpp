#include "transfer/kv_transfer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "transfer/ucx_worker.h"

namespace zest::transfer {
namespace {

using Clock = UcxWorker::Clock;

// Active messages between the two sides (small, sent eagerly; UCX checks nothing, so each carries a magic number).
// Both sides install handlers for all three: UCX 1.13 reads a wild pointer in ucp_am_handler_reply (seen under
// AddressSanitizer) for a message with the reply flag to an id without a handler, as a handle naming a Reader sends.
constexpr unsigned kAmAcquire = 11;  // reader -> offerer: hold offer `id` while I read it; answer with kAmGrant
constexpr unsigned kAmGrant = 12;    // offerer -> reader: the answer to kAmAcquire `token`
constexpr unsigned kAmRelease = 13;  // reader -> offerer: drop offer `id`
constexpr uint64_t kMagic = 0x31766b7473657aULL;  // "zestkv1"

struct AcquireMsg {
  uint64_t magic, id, token, address;
  int64_t bytes;
  double read_timeout_s;  // how long the reader may have gets in flight; the offerer holds the offer that long
                          // (plus hold_s)
};
enum : int64_t { kGranted = 0, kUnknownOffer = 1, kMismatch = 2, kNotAnOfferer = 3, kNoAnswer = -1 };
struct GrantMsg {
  uint64_t magic, token;
  int64_t result;
};
struct ReleaseMsg {
  uint64_t magic, id;
};

// Larger reads go as gets of kGetPiece bytes, kGetWindow of them in flight.
constexpr int64_t kGetPiece = 4 << 20;
constexpr int kGetWindow = 4;
// A read that timed out or failed returns only once none of its gets can write into the caller's buffer any more:
// it waits up to kDrainWaitS for those in flight to finish, then force-closes the endpoint and waits up to
// kCancelWaitS for UCX to cancel them.
constexpr double kDrainWaitS = 2;
constexpr double kCancelWaitS = 5;
// How long the Reader's destructor lets the endpoints flush (the last release messages) before it drops them.
constexpr double kCloseFlushS = 1;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

template <typename T>
bool parse_message(const void* data, size_t length, const ucp_am_recv_param_t* param, T& out) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || length != sizeof(T) || data == nullptr) return false;
  std::memcpy(&out, data, sizeof(T));
  return out.magic == kMagic;
}

// A message in flight: its bytes live here until UCX is done with them.
template <typename T>
struct MessageSend : UcxWorker::Pending {
  T body;
};

// With the worker's mutex held.
template <typename T>
ucs_status_t send_message(UcxWorker& w, ucp_ep_h ep, unsigned id, const T& body, uint32_t flags = 0) {
  auto p = std::make_unique<MessageSend<T>>();
  p->body = body;
  const T* bytes = &p->body;
  return w.post(std::move(p), [&](const ucp_request_param_t& base) {
    ucp_request_param_t param = base;
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags | UCP_AM_SEND_FLAG_EAGER;
    return ucp_am_send_nbx(ep, id, nullptr, 0, bytes, sizeof(T), &param);
  });
}

// With the worker's mutex held (from an active-message handler): answers a kAmAcquire.
void answer(UcxWorker& w, const ucp_am_recv_param_t* param, uint64_t token, int64_t result) {
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 && param->reply_ep != nullptr) {
    (void)send_message(w, param->reply_ep, kAmGrant, GrantMsg{kMagic, token, result});
  }
}

ucs_status_t ignore_message(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) { return UCS_OK; }

std::string this_origin() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return std::string(host) + ":" + std::to_string(getpid());
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Handle

nlohmann::json Handle::to_json() const {
  nlohmann::json j = {{"agent", agent}, {"id", id}, {"address", address}, {"rkey", rkey}, {"bytes", bytes}};
  if (!origin.empty()) j["origin"] = origin;
  return j;
}

Result<Handle> Handle::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("KV transfer handle: not a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json* {
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
  };
  auto missing = [](const char* name) {
    return invalid_argument(std::string("KV transfer handle: no field '") + name + "'");
  };
  auto ill_typed = [](const char* name, const char* want) {
    return invalid_argument(std::string("KV transfer handle: field '") + name + "' is not " + want);
  };
  auto get_hex = [&](const char* name, std::string& out, bool allow_empty) -> Status {
    const nlohmann::json* v = field(name);
    if (v == nullptr) return missing(name);
    if (!v->is_string()) return ill_typed(name, "a string");
    out = v->get<std::string>();
    std::vector<uint8_t> bytes;
    if (!from_hex(out, bytes)) return ill_typed(name, "a hex string");
    if (!allow_empty && bytes.empty()) return ill_typed(name, "a non-empty hex string");
    return Status::ok();
  };
  auto get_u64 = [&](const char* name, uint64_t& out) -> Status {
    const nlohmann::json* v = field(name);
    if (v == nullptr) return missing(name);
    if (v->is_number_unsigned()) {
      out = v->get<uint64_t>();
    } else if (v->is_number_integer() && v->get<int64_t>() >= 0) {
      out = static_cast<uint64_t>(v->get<int64_t>());
    } else {
      return ill_typed(name, "a non-negative integer");
    }
    return Status::ok();
  };

  Handle h;
  ZEST_RETURN_IF_ERROR(get_hex("agent", h.agent, false));
  ZEST_RETURN_IF_ERROR(get_u64("id", h.id));
  ZEST_RETURN_IF_ERROR(get_u64("address", h.address));
  ZEST_RETURN_IF_ERROR(get_hex("rkey", h.rkey, true));
  const nlohmann::json* bytes = field("bytes");
  if (bytes == nullptr) return missing("bytes");
  if (!bytes->is_number_integer()) return ill_typed("bytes", "an integer");
  if (bytes->is_number_unsigned() && bytes->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return ill_typed("bytes", "an integer in range");
  }
  h.bytes = bytes->get<int64_t>();
  if (h.bytes < 0) return invalid_argument("KV transfer handle: field 'bytes' is negative");
  if (h.bytes > 0 && h.rkey.empty()) {
    return invalid_argument("KV transfer handle: field 'rkey' is empty for a non-empty buffer");
  }
  if (const nlohmann::json* origin = field("origin")) {
    if (!origin->is_string()) return ill_typed("origin", "a string");
    h.origin = origin->get<std::string>();
  }
  return h;
}

// ---------------------------------------------------------------------------------------------------------------
// Offerer

struct Offerer::Impl {
  struct Offer {
    std::shared_ptr<const std::vector<uint8_t>> data;
    ucp_mem_h memh = nullptr;
    Clock::time_point deadline;
  };

  double hold_s = 60;
  std::string origin = this_origin();
  std::unique_ptr<UcxWorker> ucx;
  // Guarded by ucx->mu.
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Offer> offers;
  std::vector<uint64_t> to_release;  // ids from release messages, handled after the round of progress
  Clock::time_point next_sweep = Clock::time_point::max();
  TransferStats stats;

  ~Impl() {
    if (!ucx) return;
    ucx->stop();
    // The worker first: with it go the replies to gets in flight, which read the offered bytes.
    ucx->destroy_worker();
    std::lock_guard<std::mutex> lock(ucx->mu);
    for (auto& [id, offer] : offers) {
      if (offer.memh != nullptr) ucp_mem_unmap(ucx->context(), offer.memh);
    }
    offers.clear();
  }

  void drop(std::unordered_map<uint64_t, Offer>::iterator it) {
    if (it->second.memh != nullptr) ucp_mem_unmap(ucx->context(), it->second.memh);
    stats.held -= 1;
    stats.held_bytes -= static_cast<int64_t>(it->second.data->size());
    offers.erase(it);
  }

  // On the progress thread, with the mutex held.
  void after_progress() {
    for (uint64_t id : to_release) {
      auto it = offers.find(id);
      if (it == offers.end()) continue;  // expired already, or released twice
      drop(it);
      stats.released += 1;
    }
    to_release.clear();
    Clock::time_point now = Clock::now();
    if (now < next_sweep) return;
    next_sweep = Clock::time_point::max();
    for (auto it = offers.begin(); it != offers.end();) {
      if (it->second.deadline <= now) {
        auto next = std::next(it);
        drop(it);
        stats.expired += 1;
        it = next;
      } else {
        next_sweep = std::min(next_sweep, it->second.deadline);
        ++it;
      }
    }
  }

  static ucs_status_t on_acquire(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    AcquireMsg m;
    if (!parse_message(data, length, param, m)) return UCS_OK;
    int64_t result = kGranted;
    auto it = self->offers.find(m.id);
    if (it == self->offers.end()) {
      result = kUnknownOffer;
    } else {
      const auto& bytes = *it->second.data;
      uint64_t address = bytes.empty() ? 0 : reinterpret_cast<uint64_t>(bytes.data());
      if (m.bytes != static_cast<int64_t>(bytes.size()) || (m.bytes > 0 && m.address != address)) {
        result = kMismatch;
      } else {
        // Held for as long as the reader may have gets in flight, and hold_s more (a reader that dies mid-read
        // cannot leak it; one that is slow does not have the bytes freed under its gets).
        double wait = std::isfinite(m.read_timeout_s) ? std::clamp(m.read_timeout_s, 0.0, 86400.0) : 0.0;
        it->second.deadline = std::max(it->second.deadline, after(wait + self->hold_s));
      }
    }
    answer(*self->ucx, param, m.token, result);
    return UCS_OK;
  }

  static ucs_status_t on_release(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    ReleaseMsg m;
    if (parse_message(data, length, param, m)) self->to_release.push_back(m.id);
    return UCS_OK;
  }
};

Offerer::Offerer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Offerer::~Offerer() = default;

Result<std::unique_ptr<Offerer>> Offerer::start(double hold_s) {
  if (!(hold_s > 0) || !std::isfinite(hold_s)) {
    return invalid_argument("KV transfer offerer: hold time must be a positive number of seconds, got " +
                            std::to_string(hold_s));
  }
  auto impl = std::make_unique<Impl>();
  impl->hold_s = hold_s;
  Impl* raw = impl.get();
  auto ucx = UcxWorker::create("zest-kv-offerer", {{kAmAcquire, &Impl::on_acquire, raw},
                                                    {kAmRelease, &Impl::on_release, raw},
                                                    {kAmGrant, &ignore_message, nullptr}});
  if (!ucx.ok()) return ucx.status().with_context("KV transfer offerer");
  impl->ucx = std::move(ucx).value();
  impl->ucx->start([raw] { raw->after_progress(); });
  return std::unique_ptr<Offerer>(new Offerer(std::move(impl)));
}

Result<Handle> Offerer::offer(std::shared_ptr<const std::vector<uint8_t>> data) {
  if (!data) return invalid_argument("KV transfer offer: no buffer");
  Impl& m = *impl_;
  Handle h;
  h.agent = m.ucx->address_hex();
  h.origin = m.origin;
  h.bytes = static_cast<int64_t>(data->size());
  Impl::Offer offer;
  std::lock_guard<std::mutex> lock(m.ucx->mu);
  if (!data->empty()) {
    h.address = reinterpret_cast<uint64_t>(data->data());
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.address = const_cast<uint8_t*>(data->data());  // read by remote gets only
    mp.length = data->size();
    mp.memory_type = UCS_MEMORY_TYPE_HOST;
    ucs_status_t st = ucp_mem_map(m.ucx->context(), &mp, &offer.memh);
    if (st != UCS_OK) {
      return resource_exhausted("KV transfer offer: cannot register " + std::to_string(data->size()) +
                                " bytes: " + ucx_error("ucp_mem_map", st));
    }
    void* rkey = nullptr;
    size_t rkey_size = 0;
    st = ucp_rkey_pack(m.ucx->context(), offer.memh, &rkey, &rkey_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(m.ucx->context(), offer.memh);
      return internal_error("KV transfer offer: " + ucx_error("ucp_rkey_pack", st));
    }
    h.rkey = to_hex(rkey, rkey_size);
    ucp_rkey_buffer_release(rkey);
  }
  h.id = m.next_id++;
  offer.data = std::move(data);
  offer.deadline = after(m.hold_s);
  m.next_sweep = std::min(m.next_sweep, offer.deadline);
  m.offers.emplace(h.id, std::move(offer));
  m.stats.offered += 1;
  m.stats.held += 1;
  m.stats.held_bytes += h.bytes;
  return h;
}

TransferStats Offerer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->ucx->mu);
  return impl_->stats;
}

const std::string& Offerer::agent() const { return impl_->ucx->address_hex(); }

// ---------------------------------------------------------------------------------------------------------------
// Reader

struct Reader::Impl {
  // One endpoint per offering agent, shared by the reads to it.
  struct Peer {
    Impl* owner = nullptr;
    std::string agent;
    ucp_ep_h ep = nullptr;
    ucs_status_t failed = UCS_OK;  // set by the error callback
    bool closed = false;           // ep closed (or being closed); no more operations on it
  };
  struct ReadOp {
    int64_t grant = kNoAnswer;
    int gets = 0;            // in flight
    int64_t completed = 0;   // gets finished
    ucs_status_t get_status = UCS_OK;
  };
  struct GetPiece : UcxWorker::Pending {
    std::shared_ptr<ReadOp> op;
    UcxWorker* ucx = nullptr;
    void complete(ucs_status_t st) override {
      op->gets -= 1;
      op->completed += 1;
      if (st != UCS_OK && op->get_status == UCS_OK) op->get_status = st;
      ucx->cv.notify_all();
    }
  };
  struct Closing {
    std::shared_ptr<Peer> peer;
    void* request;
  };

  std::unique_ptr<UcxWorker> ucx;
  // Guarded by ucx->mu.
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers;
  std::vector<Closing> closing;
  std::unordered_map<uint64_t, std::shared_ptr<ReadOp>> grants;  // by token, waiting for kAmGrant
  uint64_t next_token = 1;
  TransferStats stats;

  ~Impl() {
    if (!ucx) return;
    ucx->stop();
    std::vector<std::shared_ptr<Peer>> keep;  // error callbacks may name them until the worker is gone
    {
      std::unique_lock<std::mutex> lock(ucx->mu);
      for (auto& [agent, peer] : peers) keep.push_back(peer);
      for (auto& peer : keep) close_peer(peer, /*force=*/peer->failed != UCS_OK);
      ucx->progress_until(lock, [&] { return reap_closing(); }, after(kCloseFlushS));
      for (Closing& c : closing) {
        keep.push_back(c.peer);
        ucp_request_free(c.request);
      }
      closing.clear();
    }
    ucx->destroy_worker();
  }

  // With the mutex held: true when no close is in flight.
  bool reap_closing() {
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i].request) != UCS_INPROGRESS) {
        ucp_request_free(closing[i].request);
        closing[i] = std::move(closing.back());
        closing.pop_back();
      } else {
        ++i;
      }
    }
    return closing.empty();
  }

  // With the mutex held: closes the endpoint (force: cancels its operations at once) and forgets it. By value: the
  // caller's pointer may be the one in `peers` that this erases.
  void close_peer(std::shared_ptr<Peer> peer, bool force) {
    if (peer->closed) return;
    peer->closed = true;
    auto it = peers.find(peer->agent);
    if (it != peers.end() && it->second == peer) peers.erase(it);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &param);
    if (UCS_PTR_IS_PTR(r)) closing.push_back({peer, r});
    ucx->cv.notify_all();
  }

  // On the progress thread: closes the endpoints that failed, reaps finished closes.
  void after_progress() {
    std::vector<std::shared_ptr<Peer>> failed;
    for (auto& [agent, peer] : peers) {
      if (peer->failed != UCS_OK) failed.push_back(peer);
    }
    for (auto& peer : failed) close_peer(peer, true);
    reap_closing();
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->failed = status == UCS_OK ? UCS_ERR_ENDPOINT_TIMEOUT : status;
    peer->owner->ucx->cv.notify_all();
  }

  static ucs_status_t on_grant(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    GrantMsg m;
    if (!parse_message(data, length, param, m)) return UCS_OK;
    auto it = self->grants.find(m.token);
    if (it == self->grants.end()) return UCS_OK;  // the reader gave up waiting
    it->second->grant = m.result;
    self->ucx->cv.notify_all();
    return UCS_OK;
  }

  // A Reader is asked for an offer (a handle naming a Reader's agent): it has none.
  static ucs_status_t on_acquire(void* arg, const void*, size_t, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    AcquireMsg m;
    if (parse_message(data, length, param, m)) answer(*static_cast<Impl*>(arg)->ucx, param, m.token, kNotAnOfferer);
    return UCS_OK;
  }

  // With the mutex held: the cached endpoint to `agent`, or a new one.
  Result<std::shared_ptr<Peer>> peer_for(const std::string& agent) {
    auto it = peers.find(agent);
    if (it != peers.end()) {
      if (it->second->failed == UCS_OK) return it->second;
      close_peer(it->second, true);
    }
    std::vector<uint8_t> address;
    if (!from_hex(agent, address) || address.empty()) return invalid_argument("the agent address is not hex");
    auto peer = std::make_shared<Peer>();
    peer->owner = this;
    peer->agent = agent;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = peer.get();
    ucs_status_t st = ucp_ep_create(ucx->worker(), &ep, &peer->ep);
    if (st != UCS_OK) return resource_exhausted("cannot connect to the offerer: " + ucx_error("ucp_ep_create", st));
    peers[agent] = peer;
    return peer;
  }
};

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() = default;

Result<std::unique_ptr<Reader>> Reader::start() {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  auto ucx = UcxWorker::create("zest-kv-reader", {{kAmGrant, &Impl::on_grant, raw},
                                                   {kAmAcquire, &Impl::on_acquire, raw},
                                                   {kAmRelease, &ignore_message, nullptr}});
  if (!ucx.ok()) return ucx.status().with_context("KV transfer reader");
  impl->ucx = std::move(ucx).value();
  impl->ucx->start([raw] { raw->after_progress(); });
  return std::unique_ptr<Reader>(new Reader(std::move(impl)));
}

Status Reader::read(const Handle& h, void* dst, double timeout_s) {
  std::string offer = "KV transfer of offer " + std::to_string(h.id) + " from offerer " +
                      (h.origin.empty() ? "" : h.origin + " ") + "(agent " + h.agent.substr(0, 16) + "...)";
  if (h.bytes < 0) return invalid_argument(offer + ": negative size " + std::to_string(h.bytes));
  if (h.bytes > 0 && dst == nullptr) return invalid_argument(offer + ": no destination buffer");
  if (!(timeout_s > 0) || !std::isfinite(timeout_s)) {
    return invalid_argument(offer + ": the timeout must be a positive number of seconds");
  }
  std::vector<uint8_t> rkey_bytes;
  if (!from_hex(h.rkey, rkey_bytes) || (h.bytes > 0 && rkey_bytes.empty())) {
    return invalid_argument(offer + ": the remote key is not hex");
  }

  Impl& m = *impl_;
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point deadline = after(timeout_s);
  std::unique_lock<std::mutex> lock(m.ucx->mu);
  auto fail = [&](const std::string& why) {
    m.stats.failed_reads += 1;
    return Status(kUnavailable, offer + ": " + why);
  };
  auto peer_or = m.peer_for(h.agent);
  if (!peer_or.ok()) {
    if (peer_or.status().code() == ErrorCode::kInvalidArgument) return peer_or.status().with_context(offer);
    return fail(peer_or.status().message());
  }
  std::shared_ptr<Impl::Peer> peer = std::move(peer_or).value();
  auto peer_gone = [&] { return peer->failed != UCS_OK || peer->closed; };
  auto why_gone = [&] {
    if (peer->failed != UCS_OK) {
      return std::string("the offerer is unreachable (") + ucs_status_string(peer->failed) + ")";
    }
    return std::string("the connection to the offerer was closed (another read gave up on it)");
  };

  // 1. Ask the offerer to hold the offer while we read it. Over transports without hardware RMA (tcp) UCX emulates
  //    the get with messages that the offerer serves from the address without checking it, so reading an offer that
  //    was already dropped must not be tried.
  auto op = std::make_shared<Impl::ReadOp>();
  const uint64_t token = m.next_token++;
  m.grants[token] = op;
  // The offerer holds the offer for as long as this read may have gets in flight (and its hold time more): over tcp
  // it serves them from the buffer itself, which must not be freed under them.
  AcquireMsg ask{kMagic, h.id, token, h.address, h.bytes, timeout_s + kDrainWaitS + kCancelWaitS};
  ucs_status_t st = send_message(*m.ucx, peer->ep, kAmAcquire, ask, UCP_AM_SEND_FLAG_REPLY);
  m.ucx->signal();
  if (st == UCS_OK) {
    m.ucx->cv.wait_until(lock, deadline, [&] { return op->grant != kNoAnswer || peer_gone(); });
  }
  m.grants.erase(token);
  if (st != UCS_OK) return fail("cannot reach the offerer: " + ucx_error("ucp_am_send_nbx", st));
  if (op->grant == kNoAnswer) {
    if (peer_gone()) return fail(why_gone());
    return fail("no answer from the offerer within " + seconds_text(timeout_s));
  }
  if (op->grant == kUnknownOffer) {
    return fail("the offerer does not hold this offer (released, or dropped after its hold time)");
  }
  if (op->grant == kNotAnOfferer) return fail("the agent is a KV reader, not an offerer");
  if (op->grant != kGranted) return fail("the offerer refused: the handle's address or size does not match the offer");
  // The endpoint may have failed or been closed (by another read's timeout) while we waited without the mutex.
  if (peer_gone()) return fail(why_gone());

  // 2. The gets, in pieces, a window of them in flight (the most a read that fails leaves to drain).
  if (h.bytes > 0) {
    ucp_rkey_h rkey = nullptr;
    st = ucp_ep_rkey_unpack(peer->ep, rkey_bytes.data(), &rkey);
    if (st != UCS_OK) {
      (void)send_message(*m.ucx, peer->ep, kAmRelease, ReleaseMsg{kMagic, h.id});
      m.ucx->signal();
      return fail("the remote key does not unpack: " + ucx_error("ucp_ep_rkey_unpack", st));
    }
    int64_t next = 0;
    bool timed_out = false;
    for (;;) {
      while (op->get_status == UCS_OK && !peer_gone() && next < h.bytes && op->gets < kGetWindow) {
        const int64_t off = next;
        const size_t len = static_cast<size_t>(std::min(kGetPiece, h.bytes - off));
        next += static_cast<int64_t>(len);
        auto piece = std::make_unique<Impl::GetPiece>();
        piece->op = op;
        piece->ucx = m.ucx.get();
        op->gets += 1;
        void* to = static_cast<uint8_t*>(dst) + off;
        (void)m.ucx->post(std::move(piece), [&](const ucp_request_param_t& param) {
          return ucp_get_nbx(peer->ep, to, len, h.address + static_cast<uint64_t>(off), rkey, &param);
        });
      }
      if (op->gets == 0 || op->get_status != UCS_OK || peer_gone()) break;
      m.ucx->signal();
      const int64_t seen = op->completed;
      if (!m.ucx->cv.wait_until(lock, deadline, [&] { return op->completed != seen || peer_gone(); })) {
        timed_out = true;
        break;
      }
    }
    if (op->gets > 0) {
      // Gets in flight (they write into dst) after a timeout or a failure. A peer that failed has them completed
      // with errors by UCX; a live one finishes them soon (a window at most). Only a peer that does not (hung) gets
      // its endpoint force-closed, which cancels them: UCX 1.13 can crash the offering process when its end of a
      // connection fails with get replies queued (seen over tcp), so a live offerer is never cut off mid-read.
      m.ucx->cv.wait_until(lock, after(kDrainWaitS), [&] { return op->gets == 0 || peer_gone(); });
      if (op->gets > 0) {
        m.close_peer(peer, true);
        m.ucx->signal();
        m.ucx->cv.wait_until(lock, after(kCancelWaitS), [&] { return op->gets == 0; });
      }
      if (op->gets > 0) {  // not cancelled: leave the rkey to the worker rather than free it under them
        m.stats.failed_reads += 1;
        return internal_error(offer + ": the read could not be cancelled within " + seconds_text(kCancelWaitS) +
                              "; the destination buffer may still be written");
      }
    }
    ucp_rkey_destroy(rkey);
    if (timed_out) return fail("the read did not finish within " + seconds_text(timeout_s));
    if (op->get_status != UCS_OK || next < h.bytes) {
      if (peer_gone()) return fail(why_gone());
      return fail("the read failed: " + ucx_error("ucp_get_nbx", op->get_status));
    }
  }

  // 3. Done: the offerer may drop it (if the endpoint went away meanwhile, the offer expires instead).
  if (!peer->closed) {
    (void)send_message(*m.ucx, peer->ep, kAmRelease, ReleaseMsg{kMagic, h.id});
    m.ucx->signal();
  }
  m.stats.reads += 1;
  m.stats.read_bytes += h.bytes;
  m.stats.read_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::ok();
}

void Reader::release(const Handle& h) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.ucx->mu);
  auto peer = m.peer_for(h.agent);
  if (!peer.ok()) return;
  (void)send_message(*m.ucx, (*peer)->ep, kAmRelease, ReleaseMsg{kMagic, h.id});
  m.ucx->signal();
}

const std::string& Reader::agent() const { return impl_->ucx->address_hex(); }

TransferStats Reader::stats() const {
  std::lock_guard<std::mutex> lock(impl_->ucx->mu);
  return impl_->stats;
}

}  // namespace zest::transfer
