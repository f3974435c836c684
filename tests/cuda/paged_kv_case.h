// A paged KV cache for the tests of the products that prefetch a decode step's KV rows (KvPrefetch): one sequence a
// context length, blocks dealt from a shuffled table, random bf16 K and V rows of Hkv heads of 128.
#pragma once
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {

struct PagedKvCase {
  HostBF16 kc, vc;  // the caches' contents, [blocks, kKvBlock, Hkv, 128]
  std::unique_ptr<DevBuf<bf16>> dk, dv;
  DevBuf<int32_t> dbt, dlens;
  KvPrefetch kv;  // describes them (no norm weight)

  // Context lengths up to 1025 tokens.
  PagedKvCase(const std::vector<int32_t>& lens, int Hkv, std::mt19937& rng) {
    const int M = static_cast<int>(lens.size());
    const int max_blocks = 1025 / kKvBlock + 2, blocks = M * max_blocks;
    std::vector<int32_t> bt(blocks);
    std::iota(bt.begin(), bt.end(), 0);
    std::shuffle(bt.begin(), bt.end(), rng);
    const size_t cache_elems = static_cast<size_t>(blocks) * kKvBlock * Hkv * 128;
    kc = random_bf16(cache_elems, rng);
    vc = random_bf16(cache_elems, rng);
    dk = upload_bf16(kc);
    dv = upload_bf16(vc);
    dbt.resize(bt.size());
    dbt.upload(bt);
    dlens.resize(lens.size());
    dlens.upload(lens);
    kv.k_cache = dk->get();
    kv.v_cache = dv->get();
    kv.block_table = dbt.get();
    kv.context_lens = dlens.get();
    kv.batch = M;
    kv.max_blocks = max_blocks;
    kv.row_bytes = Hkv * 128 * 2;
  }
};

}  // namespace zest::cuda::test
