// A decoder split over the GPUs of one host (backend/cuda.h): NCCL communicators for its ranks, and the ranks as CUDA
// decoders, one a GPU, behind one model::ParallelDecoder.
#include <cuda_runtime.h>
#include <dlfcn.h>
#ifdef ZEST_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda.h"
#include "model/parallel_decoder.h"

namespace zest::model {
#ifdef ZEST_HAVE_NCCL
namespace {

// NCCL's entry points, loaded when a group is first made: zest starts (and runs on one GPU) where the toolkit's
// libnccl is missing, and only a split decoder needs it.
struct NcclApi {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi* nccl_api() {
  static const NcclApi* api = []() -> const NcclApi* {
    void* h = nullptr;
    for (const char* name : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"})
      if ((h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    if (!h) return nullptr;
    static NcclApi a;
    a.comm_init_all = reinterpret_cast<decltype(&ncclCommInitAll)>(dlsym(h, "ncclCommInitAll"));
    a.all_reduce = reinterpret_cast<decltype(&ncclAllReduce)>(dlsym(h, "ncclAllReduce"));
    a.comm_destroy = reinterpret_cast<decltype(&ncclCommDestroy)>(dlsym(h, "ncclCommDestroy"));
    a.comm_abort = reinterpret_cast<decltype(&ncclCommAbort)>(dlsym(h, "ncclCommAbort"));
    a.error_string = reinterpret_cast<decltype(&ncclGetErrorString)>(dlsym(h, "ncclGetErrorString"));
    return a.comm_init_all && a.all_reduce && a.comm_destroy && a.comm_abort && a.error_string ? &a : nullptr;
  }();
  return api;
}

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + nccl_api()->error_string(r));
}

class NcclMember final : public Communicator {
 public:
  NcclMember(ncclComm_t comm, int rank, int world, const std::atomic<bool>* aborted)
      : comm_(comm), rank_(rank), world_(world), aborted_(aborted) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  Status all_reduce_sum(float*, int64_t) override {
    return unsupported("the NCCL communicator sums device values (all_reduce_sum_device), not host ones");
  }
  Status broadcast(void*, int64_t, int) override {
    return unsupported("the NCCL communicator does not broadcast host values");
  }
  bool reduces_on_device() const override { return true; }
  Status all_reduce_sum_device(void* data, int64_t n, bool bf16, void* stream) override {
    if (n < 0) return invalid_argument("all-reduce of a negative count");
    if (n == 0) return Status::ok();
    if (aborted_->load()) return internal_error("the NCCL communicators were aborted after a rank's GPU failed");
    return nccl_status(nccl_api()->all_reduce(data, data, static_cast<size_t>(n), bf16 ? ncclBfloat16 : ncclFloat32,
                                              ncclSum, comm_, static_cast<cudaStream_t>(stream)),
                       "ncclAllReduce");
  }

 private:
  ncclComm_t comm_;
  int rank_, world_;
  const std::atomic<bool>* aborted_;
};

class NcclGroup final : public CommunicatorGroup {
 public:
  explicit NcclGroup(std::vector<ncclComm_t> comms) : comms_(std::move(comms)) {
    const int n = static_cast<int>(comms_.size());
    for (int r = 0; r < n; ++r) members_.push_back(std::make_unique<NcclMember>(comms_[r], r, n, &aborted_));
  }
  ~NcclGroup() override {
    if (!aborted_.load())
      for (ncclComm_t c : comms_) nccl_api()->comm_destroy(c);
  }
  int world() const override { return static_cast<int>(comms_.size()); }
  Communicator& member(int rank) override { return *members_.at(static_cast<size_t>(rank)); }
  // ncclCommAbort of every rank's communicator (once): their kernels waiting on a failed rank end, the GPUs go on;
  // the communicators are freed.
  void abort_device() override {
    if (aborted_.exchange(true)) return;
    for (ncclComm_t c : comms_) nccl_api()->comm_abort(c);
  }
  bool broken() const override { return aborted_.load(); }

 private:
  std::atomic<bool> aborted_{false};
  std::vector<ncclComm_t> comms_;
  std::vector<std::unique_ptr<NcclMember>> members_;
};

}  // namespace

Result<std::unique_ptr<CommunicatorGroup>> create_nccl_group(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 2) return invalid_argument("an NCCL group needs at least two GPUs");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return invalid_argument("an NCCL group takes each GPU once (NCCL runs one rank per device)");
  for (int d : devices)
    if (d < 0 || d >= count)
      return invalid_argument("GPU " + std::to_string(d) + " does not exist (" + std::to_string(count) +
                              " visible)");
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast stays off unless asked for
  int current = 0;
  cudaGetDevice(&current);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  if (!nccl_api())
    return unsupported("NCCL (libnccl.so.2 of the CUDA toolkit) could not be loaded: a decoder split over GPUs needs it");
  const Status s = nccl_status(nccl_api()->comm_init_all(comms.data(), n, devices.data()), "ncclCommInitAll");
  cudaSetDevice(current);
  ZEST_RETURN_IF_ERROR(s);
  // Behind a host gate: a rank that fails before queuing a collective releases the others with an error
  // (GatedDeviceGroup) instead of leaving their streams waiting on the GPU.
  return std::unique_ptr<CommunicatorGroup>(
      std::make_unique<GatedDeviceGroup>(std::make_unique<NcclGroup>(std::move(comms))));
}
#else
Result<std::unique_ptr<CommunicatorGroup>> create_nccl_group(const std::vector<int>&) {
  return unsupported("zest was built without NCCL (no nccl.h / libnccl in the CUDA toolkit): one GPU only");
}
#endif

Result<std::unique_ptr<TextDecoder>> create_cuda_parallel_decoder(const DecoderWeights& w, const ParallelOptions& par,
                                                                  const DeviceDecodeOptions& opts,
                                                                  std::unique_ptr<CommunicatorGroup> group) {
  const int world = std::max(1, par.tensor_parallel);
  if (world == 1 && !par.expert_parallel) return create_cuda_decoder(w, opts);
  if (world == 1) return invalid_argument("--expert-parallel places experts on the GPUs of --tensor-parallel (2 or more)");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (count < world)
    return invalid_argument("--tensor-parallel " + std::to_string(world) + " runs a rank on each of as many GPUs; " +
                            std::to_string(count) + " visible");
  std::vector<int> devices(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) devices[r] = r;
  // Every rank reads device rows rank 0's GPU holds (the vision tower's visual rows): peer access between the GPUs.
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      cudaDeviceCanAccessPeer(&can, a, b);
      if (!can) continue;
      cudaSetDevice(a);
      if (cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess) cudaGetLastError();  // already enabled
    }
  cudaSetDevice(devices[0]);
  if (!group) {
    ZEST_ASSIGN_OR_RETURN(group, create_nccl_group(devices));
  }
  if (group->world() != world) return invalid_argument("the communicator group has another number of ranks");
  auto make = [&](const DecoderWeights& shard, int r) -> Result<std::unique_ptr<TextDecoder>> {
    if (cudaSetDevice(devices[r]) != cudaSuccess) return internal_error("cudaSetDevice(" + std::to_string(r) + ")");
    auto d = create_cuda_decoder(shard, opts);  // on the rank's GPU
    cudaSetDevice(devices[0]);
    return d;
  };
  ZEST_ASSIGN_OR_RETURN(auto d, ParallelDecoder::create(w, world, par.expert_parallel, make, std::move(group)));
  return std::unique_ptr<TextDecoder>(std::move(d));
}

}  // namespace zest::model
