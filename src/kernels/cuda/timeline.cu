// Step timeline and launch log (kernels.h): the host side of the per-CTA PDL-wait records that common.cuh's
// pdl_wait() writes, for benchmarks that look at where a replayed decode step spends its time.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

using Setter = cudaError_t (*)(void*);

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Setter>& setters() {
  static std::vector<Setter> v;
  return v;
}

std::atomic<bool> g_log_on{false}, g_timing_on{false};
std::mutex g_log_mutex;
std::vector<std::string> g_log;
struct TimedLaunch {
  std::string name;
  cudaStream_t stream;
  cudaEvent_t event;
};
std::vector<TimedLaunch> g_timed;  // under g_log_mutex

void destroy_events(std::vector<TimedLaunch>& v) {
  for (TimedLaunch& t : v) cudaEventDestroy(t.event);
  v.clear();
}

}  // namespace

bool register_step_timeline_unit(cudaError_t (*setter)(void*)) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  setters().push_back(setter);
  return true;
}

bool step_timeline_built() {
#ifdef ZEST_STEP_TIMELINE
  return true;
#else
  return false;
#endif
}

Status set_step_timeline(void* device_buffer) {
  if (!step_timeline_built())
    return unsupported("step timeline: this build's kernels do not record (the ZEST_STEP_TIMELINE build does: "
                       "bench_decode_timeline, test_cuda_timeline)");
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (Setter s : setters()) ZEST_RETURN_IF_ERROR(cuda_status(s(device_buffer), "set_step_timeline"));
  return Status::ok();
}

void set_launch_log(bool on) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (on) g_log.clear();
  g_log_on.store(on, std::memory_order_relaxed);
}

std::vector<std::string> take_launch_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::vector<std::string> out;
  out.swap(g_log);
  return out;
}

void set_launch_timing(bool on) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (on) destroy_events(g_timed);
  g_timing_on.store(on, std::memory_order_relaxed);
}

Result<std::vector<std::pair<std::string, float>>> take_launch_times() {
  std::vector<TimedLaunch> timed;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    timed.swap(g_timed);
  }
  std::map<cudaStream_t, cudaEvent_t> tail;  // per stream, the event after its last launch
  auto times = [&]() -> Result<std::vector<std::pair<std::string, float>>> {
    for (const TimedLaunch& t : timed) {
      if (tail.count(t.stream)) continue;
      ZEST_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&tail[t.stream]), "take_launch_times"));
      ZEST_RETURN_IF_ERROR(cuda_status(cudaEventRecord(tail[t.stream], t.stream), "take_launch_times"));
    }
    ZEST_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "take_launch_times"));
    std::vector<std::pair<std::string, float>> out;
    for (size_t i = 0; i < timed.size(); ++i) {
      cudaEvent_t next = tail[timed[i].stream];
      for (size_t j = i + 1; j < timed.size(); ++j)
        if (timed[j].stream == timed[i].stream) {
          next = timed[j].event;
          break;
        }
      float ms = 0.f;
      ZEST_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms, timed[i].event, next), "take_launch_times"));
      out.emplace_back(timed[i].name, ms);
    }
    return out;
  };
  auto out = times();
  destroy_events(timed);
  for (auto& [stream, e] : tail)
    if (e) cudaEventDestroy(e);
  return out;
}

void note_launch(const char* name, cudaStream_t stream) {
  const bool log = g_log_on.load(std::memory_order_relaxed), timing = g_timing_on.load(std::memory_order_relaxed);
  if (!log && !timing) return;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (log) g_log.emplace_back(name);
  if (timing) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    cudaEventRecord(e, stream);
    g_timed.push_back({name, stream, e});
  }
}

Result<void*> alloc_step_timeline(int sms, int capacity) {
  if (sms <= 0 || capacity <= 0) return invalid_argument("alloc_step_timeline: sms and capacity must be positive");
  const size_t words = 2 + static_cast<size_t>(sms) + 4 * static_cast<size_t>(sms) * capacity;
  void* buf = nullptr;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&buf, words * 8), "cudaMalloc(step timeline)"));
  std::vector<unsigned long long> head(2 + static_cast<size_t>(sms), 0);
  head[0] = static_cast<unsigned long long>(sms);
  head[1] = static_cast<unsigned long long>(capacity);
  const cudaError_t e = cudaMemcpy(buf, head.data(), head.size() * 8, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(buf);
    return cuda_status(e, "step timeline header");
  }
  return buf;
}

Result<std::vector<TimelineLaunch>> read_step_timeline(const void* device_buffer, long long* dropped,
                                                       long long* orphans) {
  if (!device_buffer) return invalid_argument("read_step_timeline: null buffer");
  unsigned long long dims[2];
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpy(dims, device_buffer, sizeof(dims), cudaMemcpyDeviceToHost), "copy"));
  const size_t sms = dims[0], cap = dims[1];
  std::vector<unsigned long long> all(2 + sms + 4 * sms * cap);
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(all.data(), device_buffer, all.size() * 8, cudaMemcpyDeviceToHost), "copy"));
  long long lost = 0;
  std::map<unsigned long long, TimelineLaunch> by_grid;
  std::map<unsigned long long, TimelineLaunch> phases;
  std::map<unsigned long long, std::vector<unsigned int>> ctas;
  for (size_t sm = 0; sm < sms; ++sm) {
    const unsigned long long n = all[2 + sm];
    if (n > cap) lost += static_cast<long long>(n - cap);
    for (size_t i = 0; i < std::min<unsigned long long>(n, cap); ++i) {
      const unsigned long long* r = &all[2 + sms + 4 * (sm * cap + i)];
      const unsigned int phase = static_cast<unsigned int>(r[1] >> 56);
      if (phase > 0) {  // a phase stamp: kept apart from the wait records
        TimelineLaunch& k = phases[r[0]];
        const int ph = static_cast<int>(phase - 1) & 7;
        k.phase_first[ph] = k.phase_count[ph] ? std::min(k.phase_first[ph], r[2]) : r[2];
        k.phase_last[ph] = std::max(k.phase_last[ph], r[2]);
        ++k.phase_count[ph];
        continue;
      }
      TimelineLaunch& k = by_grid[r[0]];
      const unsigned int cta = static_cast<unsigned int>(r[1] & 0xffffffffu);
      if (k.ctas == 0) {
        k.grid = r[0];
        k.first_ready = k.last_ready = r[2];
        k.first_release = k.last_release = r[3];
      }
      ++k.ctas;
      k.max_cta = std::max(k.max_cta, cta);
      k.first_ready = std::min(k.first_ready, r[2]);
      k.last_ready = std::max(k.last_ready, r[2]);
      k.first_release = std::min(k.first_release, r[3]);
      k.last_release = std::max(k.last_release, r[3]);
      ctas[r[0]].push_back(cta);
    }
  }
  long long orphan = 0;
  for (const auto& [grid, ph] : phases)
    if (!by_grid.count(grid))
      for (int j = 0; j < 8; ++j) orphan += ph.phase_count[j];
  if (orphans) *orphans = orphan;
  std::vector<TimelineLaunch> out;
  for (auto& [grid, k] : by_grid) {
    std::vector<unsigned int>& c = ctas[grid];
    std::sort(c.begin(), c.end());
    k.ctas_unique = std::adjacent_find(c.begin(), c.end()) == c.end();
    auto ph = phases.find(grid);
    if (ph != phases.end())
      for (int j = 0; j < 8; ++j) {
        k.phase_count[j] = ph->second.phase_count[j];
        k.phase_first[j] = ph->second.phase_first[j];
        k.phase_last[j] = ph->second.phase_last[j];
      }
    out.push_back(k);
  }
  std::sort(out.begin(), out.end(),
            [](const TimelineLaunch& a, const TimelineLaunch& b) { return a.first_release < b.first_release; });
  if (dropped) *dropped = lost;
  return out;
}

}  // namespace zest::cuda
