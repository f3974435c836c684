#include "server/engine_loop.h"

#include <iostream>
#include <vector>

namespace zest::server {

void RequestChannel::push(const std::string& delta, const engine::RequestOutput& out, bool finished) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += delta;
    streamed_ += delta.size();
    tokens_ = static_cast<int64_t>(out.token_ids.size());
    if (finished) {
      // The streamed pieces must add up to the final text; send whatever the deltas left out.
      if (out.text.size() > streamed_) pending_ += out.text.substr(streamed_);
      finished_ = true;
      output_ = out;
    }
  }
  cv_.notify_all();
}

void RequestChannel::reject(Status st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    rejected_ = true;
    reject_status_ = std::move(st);
  }
  cv_.notify_all();
}

bool RequestChannel::has_news() const {
  return !pending_.empty() || tokens_ != tokens_seen_ || ((finished_ || rejected_) && !end_seen_);
}

bool RequestChannel::take(ChannelUpdate& u, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return has_news(); })) return false;
  u = ChannelUpdate{};
  u.delta = std::move(pending_);
  pending_.clear();
  u.tokens = tokens_;
  tokens_seen_ = tokens_;
  if (finished_ || rejected_) {
    end_seen_ = true;
    u.finished = finished_;
    u.output = output_;
    if (rejected_) u.rejected = reject_status_;
  }
  return true;
}

ChannelUpdate RequestChannel::wait_final() {
  ChannelUpdate u;
  while (!wait_final_for(u, std::chrono::hours(1))) {
  }
  return u;
}

bool RequestChannel::wait_final_for(ChannelUpdate& u, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return finished_ || rejected_; })) return false;
  u = ChannelUpdate{};
  u.tokens = tokens_;
  u.finished = finished_;
  u.output = output_;
  if (rejected_) u.rejected = reject_status_;
  end_seen_ = true;
  return true;
}

bool RequestChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ || rejected_;
}

EngineLoop::EngineLoop(std::shared_ptr<engine::ModelBundle> model, engine::EngineOptions opts)
    : engine_(std::move(model), std::move(opts)) {
  max_context_ = engine_.max_context();
  stats_ = engine_.stats();
}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stop_) return;
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::submit(engine::Request req, std::function<void(const Status&)> on_rejected) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      Command c;
      c.id = req.id;
      c.req = std::move(req);
      c.on_rejected = std::move(on_rejected);
      commands_.push_back(std::move(c));
      cv_.notify_one();
      return;
    }
  }
  if (on_rejected) on_rejected(resource_exhausted("the server is shutting down"));
}

void EngineLoop::abort(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  Command c;
  c.is_abort = true;
  c.id = id;
  commands_.push_back(std::move(c));
  cv_.notify_one();
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

engine::EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void EngineLoop::publish_stats() {
  const engine::EngineStats s = engine_.stats();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

void EngineLoop::apply(Command& c) {
  if (c.is_abort) {
    if (live_.count(c.id)) engine_.abort(c.id);
    return;
  }
  const int64_t id = c.id;
  auto user = std::move(c.req.on_update);
  c.req.on_update = [this, id, user](const std::string& delta, const engine::RequestOutput& out, bool finished) {
    if (finished) live_.erase(id);
    if (user) user(delta, out, finished);
  };
  live_.insert(id);
  Status st = engine_.add(std::move(c.req));
  if (!st.is_ok()) {
    live_.erase(id);
    if (c.on_rejected) c.on_rejected(st);
  }
}

void EngineLoop::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !commands_.empty() || engine_.has_work(); });
    std::deque<Command> cmds;
    cmds.swap(commands_);
    const bool stopping = stop_;
    lock.unlock();
    for (Command& c : cmds) {
      if (stopping && !c.is_abort) {
        if (c.on_rejected) c.on_rejected(resource_exhausted("the server is shutting down"));
        continue;
      }
      apply(c);
    }
    if (stopping) {
      const std::vector<int64_t> ids(live_.begin(), live_.end());
      for (int64_t id : ids) engine_.abort(id);
      publish_stats();
      return;
    }
    if (engine_.has_work()) {
      try {
        Status st = engine_.step();
        if (!st.is_ok()) std::cerr << "zest serve: engine step failed: " << st.to_string() << "\n";
      } catch (const std::exception& e) {
        // Nothing may escape the engine thread; end every request rather than the process.
        std::cerr << "zest serve: engine step threw: " << e.what() << "; aborting all requests\n";
        const std::vector<int64_t> ids(live_.begin(), live_.end());
        for (int64_t id : ids) engine_.abort(id);
      }
    }
    publish_stats();
    lock.lock();
  }
}

}  // namespace zest::server
