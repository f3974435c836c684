#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "core/timer.h"
#include "server/openai.h"

namespace zest::server {
namespace {

thread_local Connection* t_connection = nullptr;

// poll() for `events` on one socket, retried on EINTR; the revents, 0 on timeout, -1 on error.
int poll_one(socket_t sock, short events, int timeout_ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r;
    return p.revents;
  }
}

void peer_address(socket_t sock, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ip.clear();
  port = 0;
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// A socket stream whose reads end at the connection's request deadline or after `idle_read_s` of
// silence (the library's stream knows only the second), with a read buffer (the request line and headers
// are read a byte at a time).
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, const ConnectionLimits& lim) : c_(c), lim_(lim) {}

  bool is_readable() const override {
    return pos_ < end_ || poll_one(c_.sock(), POLLIN, read_wait_ms()) > 0;
  }
  bool is_writable() const override {
    return poll_one(c_.sock(), POLLOUT, lim_.write_s * 1000) > 0 && !c_.client_gone();
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_) {
      const int wait = read_wait_ms();
      if (wait <= 0 || poll_one(c_.sock(), POLLIN, wait) <= 0) {
        c_.read_timed_out = true;
        return -1;
      }
      ssize_t n;
      do n = ::recv(c_.sock(), buf_, sizeof(buf_), 0);
      while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - pos_);
    std::copy(buf_ + pos_, buf_ + pos_ + n, ptr);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(c_.sock(), ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.ip();
    port = c_.port();
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (::getsockname(c_.sock(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
      port = ntohs(a->sin_port);
    }
    ip = buf;
  }
  socket_t socket() const override { return c_.sock(); }

 private:
  // How long the next read may wait: the idle limit, cut at the request deadline.
  int read_wait_ms() const {
    const double left = c_.read_deadline_ms - now_ms();
    return static_cast<int>(std::max(0.0, std::min<double>(lim_.idle_read_s * 1000.0, left)));
  }

  Connection& c_;
  const ConnectionLimits& lim_;
  char buf_[4096];
  size_t pos_ = 0, end_ = 0;
};

// Writes a whole small response straight to the socket (best effort; the connection is closed after).
void send_plain(socket_t sock, int status, const char* reason, const std::string& body) {
  const std::string msg = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                          "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  size_t off = 0;
  while (off < msg.size() && poll_one(sock, POLLOUT, 1000) > 0) {
    const ssize_t n = ::send(sock, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

bool Connection::client_gone() const {
  const int ev = poll_one(sock_, POLLIN | POLLRDHUP, 0);
  if (ev < 0) return true;
  if (ev & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (ev & POLLIN) {
    char c;
    ssize_t n;
    do n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  return false;
}

Connection* current_connection() { return t_connection; }

void HttpServer::configure(int threads, size_t max_body) {
  new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  set_payload_max_length(max_body);
  set_tcp_nodelay(true);
  set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

Result<int> HttpServer::bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = bind_to_any_port(host);
    if (bound <= 0) return invalid_argument("cannot bind any port on host '" + host + "'");
  } else if (!bind_to_port(host, port)) {
    return invalid_argument("cannot bind " + host + ":" + std::to_string(port) +
                            " (in use, or not a local address); pick another --port or --host");
  }
  if (!set_backlog(1024)) return internal_error("cannot set the listen backlog of the server socket");
  return bound;
}

Status HttpServer::listen_on(std::thread& thread) {
  thread = std::thread([this] { listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (is_running()) return Status::ok();
  stop();
  thread.join();
  return internal_error("the HTTP listener did not start");
}

bool HttpServer::set_backlog(int backlog) {
  const socket_t sock = svr_sock_;
  return sock != INVALID_SOCKET && ::listen(sock, backlog) == 0;
}

int HttpServer::count_client(const std::string& ip, int delta) {
  std::lock_guard<std::mutex> lock(clients_mu_);
  int& n = clients_[ip];
  n += delta;
  const int after = n;
  if (n == 0) clients_.erase(ip);
  return after;
}

int HttpServer::connections_from(const std::string& ip) {
  std::lock_guard<std::mutex> lock(clients_mu_);
  auto it = clients_.find(ip);
  return it == clients_.end() ? 0 : it->second;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  std::string ip;
  int port = 0;
  peer_address(sock, ip, port);
  const int n = count_client(ip, +1);
  bool ret = false;
  if (n > limits_.max_per_client + limits_.probe_per_client) {
    send_plain(sock, 429, "Too Many Requests",
               dump_json(error_body(429, "too many connections from " + ip + " (this server allows " +
                                             std::to_string(limits_.max_per_client) +
                                             " per client address: --max-connections-per-client)")));
  } else {
    Connection conn(sock, ip, port);
    conn.probe_only = n > limits_.max_per_client;
    ConnectionStream strm(conn, limits_);
    t_connection = &conn;
    // The library's loop, with a bounded wait for each next request (polled in slices so that a stopping
    // server is noticed) and a read deadline per request.
    size_t count = conn.probe_only ? 1 : keep_alive_max_count_;
    while (count > 0) {
      bool readable = false;
      const double idle_until = now_ms() + limits_.keep_alive_s * 1000.0;
      while (svr_sock_ != INVALID_SOCKET && now_ms() < idle_until) {
        const int ev = poll_one(sock, POLLIN, 50);
        if (ev < 0) break;
        if (ev > 0) {
          readable = true;
          break;
        }
      }
      if (!readable || svr_sock_ == INVALID_SOCKET) break;
      conn.read_deadline_ms = now_ms() + limits_.request_read_s * 1000.0;
      conn.read_timed_out = false;
      bool closed = false;
      ret = process_request(strm, count == 1, closed, nullptr);
      // A request that was not read in time has been answered (400 for headers, 408 for a body): close.
      if (!ret || closed || conn.read_timed_out) break;
      --count;
    }
    t_connection = nullptr;
  }
  count_client(ip, -1);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace zest::server
