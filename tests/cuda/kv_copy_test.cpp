// kv_copy_rows against a plain loop over a random paged cache and block table, both directions; and the CUDA
// decoder's K/V export and import (prefill/decode disaggregation) against one CUDA engine.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "backend/cuda.h"
#include "cuda_test_util.h"
#include "engine/chat_request.h"
#include "engine/engine.h"
#include "kernels/cuda/kv_copy.h"

namespace zest::cuda::test {
namespace {

TEST(KvCopy, GatherAndScatterMatchAPlainLoop) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t row : {512, 36}) {  // 16-byte pieces, and 2-byte elements
    SCOPED_TRACE(row);
    const int64_t layers = 3, blocks = 9, bs = 16, tokens = 37, per_layer = blocks * bs * row;
    std::vector<uint16_t> cache(static_cast<size_t>(2 * layers * per_layer));
    for (auto& x : cache) x = static_cast<uint16_t>(rng());
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    table.resize(3);  // 37 tokens in 3 blocks
    std::vector<uint16_t> want(static_cast<size_t>(2 * layers * tokens * row));
    for (int64_t lv = 0; lv < 2 * layers; ++lv)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < row; ++i)
          want[(lv * tokens + t) * row + i] = cache[lv * per_layer + (table[t / bs] * bs + t % bs) * row + i];
    DevBuf<uint16_t> d_cache(cache), d_buf(want.size());
    DevBuf<int32_t> d_table(table);
    ZEST_ASSERT_OK(kv_copy_rows(d_cache.get(), per_layer, layers, d_table.get(), tokens, bs, row, d_buf.get(), true, 0));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(d_buf.download(), want);
    // Scatter into a zeroed cache: exactly the table's rows come back, the others stay zero.
    DevBuf<uint16_t> d_empty(std::vector<uint16_t>(cache.size(), 0));
    ZEST_ASSERT_OK(kv_copy_rows(d_empty.get(), per_layer, layers, d_table.get(), tokens, bs, row, d_buf.get(), false, 0));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> back = d_empty.download(), expect(cache.size(), 0);
    for (int64_t lv = 0; lv < 2 * layers; ++lv)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < row; ++i) {
          const size_t at = lv * per_layer + (table[t / bs] * bs + t % bs) * row + i;
          expect[at] = cache[at];
        }
    EXPECT_EQ(back, expect);
  }
  EXPECT_FALSE(kv_copy_rows(nullptr, 0, 1, nullptr, 1, 16, 8, nullptr, true, 0).is_ok());
}

TEST(KvCopy, CudaDecoderImportContinuesAsOneEngine) {
  ZEST_REQUIRE_GPU();
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about the sea and its ships."}}}}};
  auto cr = engine::parse_chat_request(body, **m);
  ASSERT_TRUE(cr.ok());
  auto prompt = engine::build_prompt(**m, *cr, {});
  ASSERT_TRUE(prompt.ok());
  engine::Request full;
  full.prompt = *prompt;
  full.sampling.max_tokens = 20;
  full.sampling.temperature = 0;
  full.sampling.ignore_eos = true;
  auto ref = engine::generate_one(*m, full);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  engine::Request pre = full;
  pre.sampling.max_tokens = 1;
  pre.export_kv = true;
  auto first = engine::generate_one(*m, pre);
  ASSERT_TRUE(first.ok() && first->kv);
  EXPECT_EQ(first->kv->dtype, DType::BF16);
  engine::Request dec = full;
  dec.prompt.positions.clear();
  dec.kv = first->kv;
  dec.first_token = first->token_ids.at(0);
  auto got = engine::generate_one(*m, dec);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->token_ids, ref->token_ids);
  // The same through a snapshot left in device memory (the CUDA IPC path, without the second process).
  engine::EngineOptions on_device;
  on_device.kv_export_on_device = true;
  auto dfirst = engine::generate_one(*m, pre, on_device);
  ASSERT_TRUE(dfirst.ok() && dfirst->kv);
  EXPECT_NE(dfirst->kv->device_data, nullptr);
  EXPECT_EQ(dfirst->kv->bytes, nullptr);
  dec.kv = dfirst->kv;
  auto dgot = engine::generate_one(*m, dec);
  ASSERT_TRUE(dgot.ok()) << dgot.status().to_string();
  EXPECT_EQ(dgot->token_ids, ref->token_ids);
  // Its IPC handle: 64 bytes as hex (opening it needs another process).
  auto h = model::cuda_ipc_export(*dfirst->kv);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->size(), 128u);
  EXPECT_FALSE(model::cuda_ipc_import("zz", *dfirst->kv).ok());
}

}  // namespace
}  // namespace zest::cuda::test
