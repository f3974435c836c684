// The HTTP layer of zest serve: cpp-httplib's server with zest's own connection loop, so that slow or idle
// clients cannot hold the handler threads and a handler can tell whether its client is still there.
//
// cpp-httplib 0.11 runs each accepted connection on a pool thread (its requests and their handlers, one
// after another). HttpServer replaces that per-connection loop (the library's private virtual
// process_and_close_socket) with one that
// - waits at most keep_alive_s for the next request of a kept-alive connection,
// - gives each request request_read_s to arrive whole (request line, headers and body) and idle_read_s
//   between two reads, whatever the client's pace,
// - counts connections per client address: above max_per_client a connection may only ask for
//   /health or /metrics (anything else gets 429), and a few more than that are closed at once.
#pragma once
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"

#include "server/http.h"

namespace zest::server {

struct ConnectionLimits {
  int keep_alive_s = 5;        // idle time allowed between two requests of a connection
  int idle_read_s = 10;        // longest silence while a request is being read
  int request_read_s = 30;     // a request (line, headers, body) must be read within this
  int write_s = 30;            // longest wait for the client to accept more of a response
  int max_per_client = 64;     // connections per client address that may ask anything
  int probe_per_client = 4;    // more connections per address that may ask for /health and /metrics only
};

// The connection a handler runs for; valid on the handler's thread while it runs.
class Connection {
 public:
  Connection(socket_t sock, std::string ip, int port) : sock_(sock), ip_(std::move(ip)), port_(port) {}
  socket_t sock() const { return sock_; }
  const std::string& ip() const { return ip_; }
  int port() const { return port_; }
  // True once the client has closed (or reset) the connection; never blocks. Data the client sends
  // meanwhile (a pipelined request) does not count as gone.
  bool client_gone() const;
  bool probe_only = false;           // over the per-address cap: /health and /metrics only
  double read_deadline_ms = 0;       // the request being read must be complete by then
  bool read_timed_out = false;       // a read failed for the deadline or the idle limit

 private:
  socket_t sock_;
  std::string ip_;
  int port_;
};

// The connection served by the calling thread (nullptr outside a handler).
Connection* current_connection();

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(ConnectionLimits limits) : limits_(limits) {}
  // `threads` handler threads, bodies up to `max_body` bytes, TCP_NODELAY, and SO_REUSEADDR only (the library's
  // default SO_REUSEPORT would let a second server share the port silently).
  void configure(int threads, size_t max_body);
  // Binds host:port (0 = any free port) with a listen backlog of 1024 (the library's 5 overflows on a burst of
  // connects); the bound port, or kInvalidArgument naming host and port.
  Result<int> bind(const std::string& host, int port);
  // Runs the accept loop on `thread` and waits (up to 10 s) until it accepts: stop() only takes effect on a running
  // listener. kInternal (the thread joined) when it did not start.
  Status listen_on(std::thread& thread);
  // Re-listens the bound socket with `backlog` pending connections; false when not bound.
  bool set_backlog(int backlog);
  // Open connections from `ip` that a handler thread has taken up (0 when none).
  int connections_from(const std::string& ip);

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Counts a connection from `ip` in (+1) or out (-1); returns the count after.
  int count_client(const std::string& ip, int delta);

  ConnectionLimits limits_;
  std::mutex clients_mu_;
  std::map<std::string, int> clients_;
};

}  // namespace zest::server
