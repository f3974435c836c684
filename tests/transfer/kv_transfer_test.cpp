// KV-cache transfer over UCX: an Offerer and a Reader in one process (two UCX workers, connected over the
// transports UCX picks here, as between two processes): round trips of several sizes, the handle's JSON, expiry,
// a dead offerer, concurrent reads, and release without reading.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <thread>

#include <ucp/api/ucp.h>

#include "transfer/kv_transfer.h"

namespace zest::transfer {
namespace {

using Bytes = std::vector<uint8_t>;

std::shared_ptr<const Bytes> random_bytes(size_t n, uint32_t seed) {
  auto b = std::make_shared<Bytes>(n);
  std::mt19937 rng(seed);
  for (auto& x : *b) x = static_cast<uint8_t>(rng());
  return b;
}

// Polls cond until it holds or `seconds` pass; the release and the expiry happen on the offerer's progress thread.
bool eventually(const std::function<bool()>& cond, double seconds = 10) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

std::unique_ptr<Offerer> start_offerer(double hold_s = 60) {
  auto o = Offerer::start(hold_s);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  return o.ok() ? std::move(o).value() : nullptr;
}

std::unique_ptr<Reader> start_reader() {
  auto r = Reader::start();
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(KvTransfer, ReadsBuffersOfSeveralSizesAndReleasesThem) {
  auto offerer = start_offerer();
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  for (size_t size : {size_t{0}, size_t{1}}) {
    // Zero and one byte: both offered and read (a zero-length offer has no remote key).
    auto data = random_bytes(size, 7);
    auto h = offerer->offer(data);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_EQ(h->bytes, static_cast<int64_t>(size));
    Bytes dst(size + 1, 0xAB);
    Status st = reader->read(*h, dst.data(), 5);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(std::equal(data->begin(), data->end(), dst.begin()));
    EXPECT_EQ(dst[size], 0xAB) << "wrote past the buffer";
  }
  auto medium = random_bytes(100 * 1000 + 3, 11);
  auto large = random_bytes(8 * 1000 * 1000 + 5, 13);
  for (const auto& data : {medium, large}) {
    auto h = offerer->offer(data);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    Bytes dst(data->size() + 1, 0xCD);
    Status st = reader->read(*h, dst.data(), 30);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(std::equal(data->begin(), data->end(), dst.begin())) << data->size() << " bytes differ";
    EXPECT_EQ(dst.back(), 0xCD) << "wrote past the buffer";
  }
  const int64_t total = 0 + 1 + static_cast<int64_t>(medium->size() + large->size());
  EXPECT_TRUE(eventually([&] { return offerer->stats().held == 0; }));
  TransferStats os = offerer->stats();
  EXPECT_EQ(os.offered, 4);
  EXPECT_EQ(os.released, 4);
  EXPECT_EQ(os.expired, 0);
  EXPECT_EQ(os.held, 0);
  EXPECT_EQ(os.held_bytes, 0);
  TransferStats rs = reader->stats();
  EXPECT_EQ(rs.reads, 4);
  EXPECT_EQ(rs.read_bytes, total);
  EXPECT_EQ(rs.failed_reads, 0);
  EXPECT_GT(rs.read_seconds, 0);
}

TEST(KvTransfer, HandleJsonRoundTripAndRefusals) {
  Handle h;
  h.agent = "00ff10ab";
  h.id = 42;
  h.address = 0x7f00deadbeefULL;
  h.rkey = "0a0b0c";
  h.bytes = 123456;
  h.origin = "host:77";
  auto back = Handle::from_json(nlohmann::json::parse(h.to_json().dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->agent, h.agent);
  EXPECT_EQ(back->id, h.id);
  EXPECT_EQ(back->address, h.address);
  EXPECT_EQ(back->rkey, h.rkey);
  EXPECT_EQ(back->bytes, h.bytes);
  EXPECT_EQ(back->origin, h.origin);

  // A real one, from an offer.
  auto offerer = start_offerer();
  ASSERT_TRUE(offerer);
  auto real = offerer->offer(random_bytes(64, 1));
  ASSERT_TRUE(real.ok());
  auto real_back = Handle::from_json(real->to_json());
  ASSERT_TRUE(real_back.ok()) << real_back.status().to_string();
  EXPECT_EQ(real_back->to_json(), real->to_json());

  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& field) {
    nlohmann::json j = h.to_json();
    edit(j);
    auto r = Handle::from_json(j);
    ASSERT_FALSE(r.ok()) << j.dump();
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos) << r.status().message();
  };
  refused([](nlohmann::json& j) { j.erase("agent"); }, "agent");
  refused([](nlohmann::json& j) { j.erase("id"); }, "id");
  refused([](nlohmann::json& j) { j.erase("rkey"); }, "rkey");
  refused([](nlohmann::json& j) { j.erase("bytes"); }, "bytes");
  refused([](nlohmann::json& j) { j["rkey"] = "0x12"; }, "rkey");
  refused([](nlohmann::json& j) { j["rkey"] = "abc"; }, "rkey");  // odd length
  refused([](nlohmann::json& j) { j["agent"] = "zz"; }, "agent");
  refused([](nlohmann::json& j) { j["bytes"] = -1; }, "bytes");
  refused([](nlohmann::json& j) { j["bytes"] = "12"; }, "bytes");
  refused([](nlohmann::json& j) { j["id"] = -3; }, "id");
  refused([](nlohmann::json& j) { j["address"] = 1.5; }, "address");
  EXPECT_FALSE(Handle::from_json(nlohmann::json::array()).ok());
}

TEST(KvTransfer, UnreadOfferExpiresAndItsReadFails) {
  auto offerer = start_offerer(0.3);
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  auto data = random_bytes(256 * 1024, 3);
  auto h = offerer->offer(data);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(offerer->stats().held, 1);
  EXPECT_EQ(offerer->stats().held_bytes, static_cast<int64_t>(data->size()));
  ASSERT_TRUE(eventually([&] { return offerer->stats().expired == 1; }, 5));
  EXPECT_EQ(offerer->stats().held, 0);
  EXPECT_EQ(offerer->stats().held_bytes, 0);

  Bytes dst(data->size(), 0);
  Status st = reader->read(*h, dst.data(), 5);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), kUnavailable);
  EXPECT_NE(st.message().find("does not hold this offer"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(h->origin), std::string::npos) << "the message names the offerer: " << st.message();
  EXPECT_EQ(reader->stats().failed_reads, 1);
  EXPECT_EQ(offerer->stats().released, 0);

  // The offerer still serves new offers.
  auto h2 = offerer->offer(data);
  ASSERT_TRUE(h2.ok());
  st = reader->read(*h2, dst.data(), 5);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(dst, *data);
}

TEST(KvTransfer, DeadOffererFailsTheReadWithinItsTimeout) {
  auto reader = start_reader();
  ASSERT_TRUE(reader);
  auto data = random_bytes(1 << 20, 5);
  Handle h, warm;
  {
    auto offerer = start_offerer();
    ASSERT_TRUE(offerer);
    auto o = offerer->offer(data);
    auto o2 = offerer->offer(data);
    ASSERT_TRUE(o.ok() && o2.ok());
    h = *o;
    warm = *o2;
    // One read first, so the reader holds a connected endpoint to the offerer that is about to die.
    Bytes dst(data->size());
    Status st = reader->read(warm, dst.data(), 5);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  Bytes dst(data->size());
  auto t0 = std::chrono::steady_clock::now();
  Status st = reader->read(h, dst.data(), 5);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find(h.origin), std::string::npos) << st.message();
  EXPECT_LT(took, 5 + 2.0) << st.to_string();
  // And again, with the endpoint that failed dropped from the cache: a fresh connection attempt fails too.
  st = reader->read(h, dst.data(), 2);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), kUnavailable) << st.to_string();
  EXPECT_EQ(reader->stats().failed_reads, 2);
  EXPECT_EQ(reader->stats().reads, 1);
}

// A UCX worker that nobody progresses: its process hangs. TCP accepts the connection, nothing answers.
class HungWorker {
 public:
  HungWorker() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    if (ucp_init(&params, nullptr, &context_) != UCS_OK) return;
    ucp_worker_params_t wp{};
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) return;
    ucp_address_t* address = nullptr;
    size_t length = 0;
    if (ucp_worker_get_address(worker_, &address, &length) != UCS_OK) return;
    static const char kDigits[] = "0123456789abcdef";
    for (size_t i = 0; i < length; ++i) {
      uint8_t b = reinterpret_cast<const uint8_t*>(address)[i];
      agent_ += kDigits[b >> 4];
      agent_ += kDigits[b & 15];
    }
    ucp_worker_release_address(worker_, address);
  }
  ~HungWorker() {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  const std::string& agent() const { return agent_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string agent_;
};

TEST(KvTransfer, HungOffererFailsTheReadAtItsTimeout) {
  auto reader = start_reader();
  ASSERT_TRUE(reader);
  HungWorker hung;
  ASSERT_FALSE(hung.agent().empty());
  Handle h;
  h.agent = hung.agent();
  h.id = 1;
  h.address = 4096;
  h.rkey = "00";
  h.bytes = 16;
  Bytes dst(16);
  auto t0 = std::chrono::steady_clock::now();
  Status st = reader->read(h, dst.data(), 0.5);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), kUnavailable);
  EXPECT_NE(st.message().find("no answer from the offerer within 0.5 s"), std::string::npos) << st.message();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 0.5 + 2.0);
}

TEST(KvTransfer, HandleNamingAReaderIsRefused) {
  auto reader = start_reader();
  auto other = start_reader();
  ASSERT_TRUE(reader && other);
  Handle h;
  h.agent = other->agent();
  h.id = 1;
  h.address = 4096;
  h.rkey = "00";
  h.bytes = 16;
  Bytes dst(16);
  Status st = reader->read(h, dst.data(), 5);
  EXPECT_EQ(st.code(), kUnavailable);
  EXPECT_NE(st.message().find("not an offerer"), std::string::npos) << st.message();
  reader->release(h);  // ignored by the other reader
}

TEST(KvTransfer, ReadsWithShortTimeoutsSucceedOrFailCleanly) {
  // Timeouts from far too short to ample on a 32 MB offer: each read either returns the bytes or fails with
  // kUnavailable (a timed-out read cancels its gets before it returns: dst is freed right after, which ASan or
  // valgrind would catch if a get still wrote to it), and the reader and offerer keep working.
  auto offerer = start_offerer();
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  auto data = random_bytes(32 << 20, 21);
  int ok = 0, failed = 0;
  for (double timeout : {1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 30.0}) {
    auto h = offerer->offer(data);
    ASSERT_TRUE(h.ok());
    auto dst = std::make_unique<Bytes>(data->size());
    Status st = reader->read(*h, dst->data(), timeout);
    if (st.is_ok()) {
      EXPECT_EQ(*dst, *data) << "timeout " << timeout;
      ++ok;
    } else {
      EXPECT_EQ(st.code(), kUnavailable) << st.to_string();
      EXPECT_NE(st.message().find("within"), std::string::npos) << st.to_string();
      ++failed;
    }
  }
  EXPECT_EQ(ok + failed, 7);
  EXPECT_GE(ok, 1);  // 30 s is ample
  EXPECT_EQ(reader->stats().failed_reads, failed);
  auto h = offerer->offer(data);
  ASSERT_TRUE(h.ok());
  Bytes dst(data->size());
  Status st = reader->read(*h, dst.data(), 30);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(dst, *data);
}

TEST(KvTransfer, ConcurrentReadsFromOneReader) {
  auto offerer = start_offerer();
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  constexpr int kThreads = 8, kPerThread = 4;
  std::vector<std::shared_ptr<const Bytes>> data;
  std::vector<Handle> handles;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    data.push_back(random_bytes(static_cast<size_t>(1000 + i * 37 * 1024 + (i % 3 == 0 ? 5 << 20 : 0)), 100 + i));
    auto h = offerer->offer(data.back());
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  std::vector<int> good(kThreads * kPerThread, 0);
  std::vector<std::string> errors(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        int i = t * kPerThread + k;
        Bytes dst(data[i]->size());
        Status st = reader->read(handles[i], dst.data(), 60);
        if (!st.is_ok()) {
          errors[i] = st.to_string();
          continue;
        }
        good[i] = dst == *data[i] ? 1 : 0;
        if (!good[i]) errors[i] = "bytes differ";
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kThreads * kPerThread; ++i) EXPECT_TRUE(good[i]) << "offer " << i << ": " << errors[i];
  EXPECT_TRUE(eventually([&] { return offerer->stats().held == 0; }));
  EXPECT_EQ(offerer->stats().released, kThreads * kPerThread);
  EXPECT_EQ(reader->stats().reads, kThreads * kPerThread);
}

TEST(KvTransfer, ReleaseWithoutReadingDropsTheOffer) {
  auto offerer = start_offerer();
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  auto kept = offerer->offer(random_bytes(4096, 8));
  auto dropped = offerer->offer(random_bytes(8192, 9));
  ASSERT_TRUE(kept.ok() && dropped.ok());
  EXPECT_EQ(offerer->stats().held, 2);
  reader->release(*dropped);
  ASSERT_TRUE(eventually([&] { return offerer->stats().held == 1; }));
  TransferStats os = offerer->stats();
  EXPECT_EQ(os.released, 1);
  EXPECT_EQ(os.held_bytes, 4096);
  EXPECT_EQ(os.expired, 0);
  // The released one cannot be read any more; the other one can.
  Bytes dst(8192);
  Status st = reader->read(*dropped, dst.data(), 5);
  EXPECT_EQ(st.code(), kUnavailable) << st.to_string();
  Bytes dst2(4096);
  st = reader->read(*kept, dst2.data(), 5);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_TRUE(eventually([&] { return offerer->stats().held == 0; }));
}

TEST(KvTransfer, RefusesBadArguments) {
  auto offerer = start_offerer();
  auto reader = start_reader();
  ASSERT_TRUE(offerer && reader);
  EXPECT_EQ(Offerer::start(0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Offerer::start(-1).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(offerer->offer(nullptr).status().code(), ErrorCode::kInvalidArgument);
  auto data = random_bytes(100, 2);
  auto h = offerer->offer(data);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(reader->read(*h, nullptr, 5).code(), ErrorCode::kInvalidArgument);
  Bytes dst(100);
  EXPECT_EQ(reader->read(*h, dst.data(), 0).code(), ErrorCode::kInvalidArgument);
  Handle bad = *h;
  bad.bytes = 50;  // does not match the offer: the offerer refuses
  Status st = reader->read(bad, dst.data(), 5);
  EXPECT_EQ(st.code(), kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("does not match"), std::string::npos) << st.message();
  ASSERT_TRUE(reader->read(*h, dst.data(), 5).is_ok());
  EXPECT_EQ(dst, *data);
}

}  // namespace
}  // namespace zest::transfer
