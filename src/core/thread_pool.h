// A fixed pool of worker threads with a deterministic parallel_for (static contiguous chunks).
#pragma once
#include <cstdint>
#include <functional>

namespace zest {

// Sets the number of threads used by parallel_for (0 = hardware concurrency). Call before first use.
void set_num_threads(int n);
int num_threads();

// Runs fn(begin, end) over [0, n) split into at most num_threads() contiguous chunks of at least
// `grain` items; returns when all chunks are done. Chunk boundaries depend only on n, grain and the
// thread count, and each index is processed by exactly one call.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace zest
