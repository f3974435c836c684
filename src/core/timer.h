// Wall-clock timing helpers (milliseconds, steady clock).
#pragma once
#include <chrono>

namespace zest {

inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace zest
