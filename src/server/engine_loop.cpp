#include "server/engine_loop.h"

#include <algorithm>
#include <iostream>
#include <vector>

namespace zest::server {

RequestChannel::RequestChannel(int n) : choices_(static_cast<size_t>(std::max(n, 1))) {}

void RequestChannel::push(int index, const std::string& delta, const engine::RequestOutput& out, bool finished) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0 || index >= static_cast<int>(choices_.size())) return;
    Choice& c = choices_[index];
    c.pending += delta;
    c.streamed += delta.size();
    c.tokens = static_cast<int64_t>(out.token_ids.size());
    for (size_t i = c.logprobs_taken; i < out.logprobs.size(); ++i) c.pending_logprobs.push_back(out.logprobs[i]);
    c.logprobs_taken = std::max(c.logprobs_taken, out.logprobs.size());
    if (finished) {
      // The streamed pieces must add up to the final text; send whatever the deltas left out.
      if (out.text.size() > c.streamed) c.pending += out.text.substr(c.streamed);
      c.finished = true;
      c.output = out;
    }
  }
  cv_.notify_all();
}

void RequestChannel::reject(Status st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rejected_) reject_status_ = std::move(st);
    rejected_ = true;
  }
  cv_.notify_all();
}

bool RequestChannel::all_finished() const {
  for (const Choice& c : choices_)
    if (!c.finished) return false;
  return true;
}

bool RequestChannel::has_news() const {
  if (rejected_ && !reject_seen_) return true;
  for (const Choice& c : choices_)
    if (!c.pending.empty() || !c.pending_logprobs.empty() || c.tokens != c.tokens_seen || (c.finished && !c.end_seen))
      return true;
  return false;
}

bool RequestChannel::take(ChannelUpdate& u, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return has_news(); })) return false;
  u = ChannelUpdate{};
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (c.pending.empty() && c.pending_logprobs.empty() && c.tokens == c.tokens_seen && !(c.finished && !c.end_seen))
      continue;
    ChoiceUpdate cu;
    cu.index = static_cast<int>(i);
    cu.delta = std::move(c.pending);
    c.pending.clear();
    cu.logprobs = std::move(c.pending_logprobs);
    c.pending_logprobs.clear();
    cu.tokens = c.tokens;
    c.tokens_seen = c.tokens;
    if (c.finished) {
      c.end_seen = true;
      cu.finished = true;
      cu.output = c.output;
    }
    u.choices.push_back(std::move(cu));
  }
  u.finished = all_finished();
  if (rejected_) {
    reject_seen_ = true;
    u.rejected = reject_status_;
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
  if (!cv_.wait_for(lock, timeout, [&] { return all_finished() || rejected_; })) return false;
  u = ChannelUpdate{};
  for (size_t i = 0; i < choices_.size(); ++i) {
    ChoiceUpdate cu;
    cu.index = static_cast<int>(i);
    cu.tokens = choices_[i].tokens;
    cu.finished = choices_[i].finished;
    cu.output = choices_[i].output;
    choices_[i].end_seen = true;
    u.choices.push_back(std::move(cu));
  }
  u.finished = all_finished();
  if (rejected_) u.rejected = reject_status_;
  reject_seen_ = true;
  return true;
}

bool RequestChannel::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_finished() || rejected_;
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
