// KV-cache transfer between a prefill and a decode instance (prefill/decode disaggregation) over UCX.
//
// Pull model, as vLLM's NIXL connector: the prefill side (Offerer) registers a request's KV bytes and hands out a
// Handle (its worker address, the buffer's address and packed remote key); the decode side (Reader) connects to that
// address, asks the offerer to hold the offer while it reads (an active message, answered), reads the bytes with
// one-sided RMA gets and tells the offerer to release it (another active message). An offer nobody releases is
// dropped after hold_s seconds, so a reader that died cannot leak it.
//
// Transports: a user's UCX_TLS wins; otherwise every transport but the shared-memory ones (UCX_TLS=^sm: posix, sysv
// and cma fail between containers of one host and under restricted ptrace), so tcp, or InfiniBand/RoCE where present.
// (UCX 1.13 would not pick them anyway: the endpoints ask for peer-failure handling, which they lack.) Over tcp UCX
// emulates the gets with active messages served by the offerer's progress thread. Every other UCX_* variable applies
// as usual; UCX's own log is cut to fatal errors unless UCX_LOG_LEVEL is set (failures come back as a Status).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace zest::transfer {

// core/status.h has no "unavailable" code; a transfer that cannot be done now (offerer gone or refusing, timeout)
// reports kResourceExhausted, the code zest already uses for "try again later" (the server maps it to 503).
inline constexpr ErrorCode kUnavailable = ErrorCode::kResourceExhausted;

// Where a remote reader finds one offered buffer.
struct Handle {
  std::string agent;     // the offering side's UCX worker address, hex
  uint64_t id = 0;       // the offer's id (unique per Offerer)
  uint64_t address = 0;  // the buffer's virtual address on the offering side
  std::string rkey;      // the packed UCX remote key, hex (empty for a zero-length buffer)
  int64_t bytes = 0;
  std::string origin;    // "host:pid" of the offering process, for messages only (optional in JSON)
  nlohmann::json to_json() const;
  // kInvalidArgument naming the field for a missing or ill-typed field, bad hex, negative bytes.
  static Result<Handle> from_json(const nlohmann::json& j);
};

struct TransferStats {
  int64_t offered = 0, released = 0, expired = 0, held = 0, held_bytes = 0;  // offering side
  int64_t reads = 0, read_bytes = 0, failed_reads = 0;                        // reading side
  double read_seconds = 0;                                                    // summed over successful reads
};

// The offering side (a prefill instance). Each offered buffer stays registered until its reader releases it or
// hold_s seconds pass (then it is dropped: a reader that died cannot leak it). A reader that started reading an offer
// holds it for as long as its read may last (its timeout and 7 s of draining) plus hold_s more. Thread-safe.
class Offerer {
 public:
  static Result<std::unique_ptr<Offerer>> start(double hold_s = 60);
  ~Offerer();  // stops the progress thread, unregisters and drops every offer
  Offerer(const Offerer&) = delete;
  Offerer& operator=(const Offerer&) = delete;
  // Registers the bytes (kept alive until released or expired); a zero-length buffer is offered too (no rkey).
  Result<Handle> offer(std::shared_ptr<const std::vector<uint8_t>> data);
  TransferStats stats() const;
  // This side's UCX worker address (hex), as Handle::agent.
  const std::string& agent() const;

  struct Impl;

 private:
  explicit Offerer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The reading side (a decode instance). Thread-safe: several threads may read at once.
class Reader {
 public:
  static Result<std::unique_ptr<Reader>> start();
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  // Reads h.bytes into dst, then tells the offerer to release the offer. kUnavailable (a clear message naming the
  // offerer) when the offerer is gone, refuses, or the read does not finish within timeout_s; never hangs.
  // kInvalidArgument for a malformed handle, a null dst with bytes > 0, or a timeout that is not positive.
  // Once it returns, nothing writes into dst: a read that timed out with gets in flight first lets them finish (at
  // most 16 MB; up to 2 s) or, from an offerer that does not answer, cancels them (up to 5 s more).
  // A read that timed out or lost its offerer does not release the offer: it expires on the offering side.
  Status read(const Handle& h, void* dst, double timeout_s);
  // Tells the offerer to drop the offer without reading it (the request was cancelled); best effort.
  void release(const Handle& h);
  TransferStats stats() const;
  // This side's UCX worker address (hex).
  const std::string& agent() const;

  struct Impl;

 private:
  explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zest::transfer
