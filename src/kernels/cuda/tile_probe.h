// A diagnostic for benchmarks: how fast CTAs move weight tiles from HBM into shared memory, by copy method. The
// small-M GEMMs of a decode step (rows_mma.cu rows_pre_kernel) bulk-copy 64-128 KB tiles before their PDL wait, and
// the step timeline shows those tiles landing at ~2-2.8 TB/s in the replayed graph; this measures each method alone.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

enum class TileCopy {
  kBulkOne = 0,    // thread 0 issues `pieces` bulk copies (cp.async.bulk, TMA) completing on one mbarrier
  kBulkLanes = 1,  // lanes of warp 0 issue the `pieces` bulk copies (at most 32 at a time)
  kCpAsync = 2,    // every thread copies 16-byte pieces (cp.async.cg)
  kLoads = 3,      // every thread loads 16-byte pieces into registers (8 in flight) and stores them to shared memory
};

// CTA b copies bytes_per_cta bytes at src + offset + b * bytes_per_cta (16-byte aligned; pieces divides
// bytes_per_cta into multiples of 16 bytes) into shared memory by `how`, then writes the XOR of the copied 32-bit words
// to sink[b]; times (optional, 2 per CTA): %globaltimer ns at the CTA's start and when its tile had landed.
// bytes_per_cta <= 200 KB. 256 threads per CTA. late_wait: the CTA's PDL wait on the previous kernel comes after it
// has issued its copies (as the decode GEMMs' prologue does), not at its start.
Status tile_copy_probe(const void* src, size_t offset, uint32_t* sink, unsigned long long* times, int ctas,
                       int bytes_per_cta, int pieces, TileCopy how, cudaStream_t stream, bool late_wait = false);

// ctas one-warp CTAs that spin for `us` microseconds and let the next kernel launch at once (programmatic dependent
// launch): a stand-in for the kernel that runs while the next one's CTAs copy their tiles.
Status busy_wait_kernel(int ctas, double us, cudaStream_t stream);

}  // namespace zest::cuda
