// The engine thread and the channels HTTP handlers use to talk to it. engine::Engine is not
// thread-safe: one EngineLoop thread owns it and is the only caller of add/abort/step. Handler
// threads queue commands (submit, abort) and read results from a per-request RequestChannel; the
// engine thread never blocks on HTTP I/O (it only appends to channels under a short lock).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"

namespace zest::server {

// News about one choice (one engine request) since the handler last looked.
struct ChoiceUpdate {
  int index = 0;
  std::string delta;                             // text produced since the last take
  std::vector<engine::TokenLogprob> logprobs;    // logprobs of the tokens generated since the last take
  int64_t tokens = 0;                            // tokens generated so far (all of them, not only the new ones)
  bool finished = false;                         // the choice ended; `output` holds its final state
  engine::RequestOutput output;
};

// News about one API request (its n choices) since the handler last looked.
struct ChannelUpdate {
  std::vector<ChoiceUpdate> choices;  // take(): the choices with news, by index; wait_final: all of them
  bool finished = false;              // every choice ended
  Status rejected;                    // not ok: the request never ran (engine refused a choice, or shutting down)
};

// One API request's mailbox between the engine thread (producer) and its HTTP handler (consumer); n choices, each
// an engine request of its own.
class RequestChannel {
 public:
  explicit RequestChannel(int n = 1);
  int size() const { return static_cast<int>(choices_.size()); }
  // Engine thread: a step of choice `index` produced `delta` (maybe empty); `finished` marks its last call.
  void push(int index, const std::string& delta, const engine::RequestOutput& out, bool finished);
  // Any thread: the request will never run (a choice that was refused refuses them all).
  void reject(Status st);
  // Waits up to `timeout` for news; moves it into `u` and returns true, or returns false when none came.
  bool take(ChannelUpdate& u, std::chrono::milliseconds timeout);
  // Waits until every choice finished or the request was rejected; returns the final update.
  ChannelUpdate wait_final();
  // The same, waiting at most `timeout`: true with the final update in `u`, false when it did not come.
  bool wait_final_for(ChannelUpdate& u, std::chrono::milliseconds timeout);
  // Every choice finished, or the request was rejected (whether or not the handler has seen it).
  bool closed() const;

 private:
  struct Choice {
    std::string pending;
    std::vector<engine::TokenLogprob> pending_logprobs;
    size_t streamed = 0;         // bytes of text received through deltas
    size_t logprobs_taken = 0;   // logprob entries moved to pending
    int64_t tokens = 0, tokens_seen = 0;
    bool finished = false, end_seen = false;
    engine::RequestOutput output;
  };
  bool has_news() const;
  bool all_finished() const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Choice> choices_;
  bool rejected_ = false, reject_seen_ = false;
  Status reject_status_;
};

class EngineLoop {
 public:
  EngineLoop(std::shared_ptr<engine::ModelBundle> model, engine::EngineOptions opts);
  // Stops the thread (see stop()).
  ~EngineLoop();

  // Starts the engine thread.
  void start();
  // Queues a request for the engine thread. If the engine refuses it (engine::Engine::add) or the loop
  // is stopped, `on_rejected` is called (on the engine thread, or at once on this thread when stopped)
  // and req.on_update never is; otherwise req.on_update is called on the engine thread until finished.
  void submit(engine::Request req, std::function<void(const Status&)> on_rejected);
  // Queues an abort; a request that already ended is left alone.
  void abort(int64_t id);
  // Refuses new requests, aborts every queued and running one (their on_update ends with kAbort) and
  // joins the engine thread. Idempotent.
  void stop();

  // Engine statistics as of the end of the last loop iteration.
  engine::EngineStats stats() const;
  // Context limit of the engine (tokens), fixed at construction.
  int64_t max_context() const { return max_context_; }

 private:
  struct Command {
    bool is_abort = false;
    int64_t id = 0;
    engine::Request req;
    std::function<void(const Status&)> on_rejected;
  };
  void run();
  void apply(Command& c);
  void publish_stats();

  engine::Engine engine_;  // touched by the engine thread only (after start)
  int64_t max_context_ = 0;
  std::unordered_set<int64_t> live_;  // engine thread only: ids added and not yet finished

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;
  bool stop_ = false, started_ = false;
  std::thread thread_;

  mutable std::mutex stats_mu_;
  engine::EngineStats stats_;
};

}  // namespace zest::server
