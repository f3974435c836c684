// rows_class (kernels.h): the row classes that gemm's cuBLASLt algorithm choice and the decode attention split plans
// are made for, and that the CUDA decoder pads graph-replayed decode steps to.
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// The ladder's sizes hold every row count where a kernel changes path: 1, 2, 4 and 8 (the decode attention by size:
// cluster merge up to 8 (sequence, kv head) pairs, the ring kernel from 9 to 32 pairs, on the ladder for 1, 2, 4 or 8
// kv heads; the decode expert kernel by batch), 16 (small-M GEMM on tensor cores, fused routing) and 64 (decode
// experts), so a padded step takes its unpadded step's kernel paths.
int rows_class(int rows) {
  static constexpr int kLadder[] = {1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64};
  if (rows > 512) return rows;
  for (int p : kLadder)
    if (rows <= p) return p;
  return (rows + 15) / 16 * 16;
}

}  // namespace zest::cuda
