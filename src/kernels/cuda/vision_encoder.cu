// vision::VisionEncoder on the CUDA vision tower: uploads the f32 pixel_values, converts them to bf16 on the
// device, runs VisionTowerCuda on a stream of its own, scores the tokens with the VisionZip score kernel and
// copies embeddings, DeepStack features and scores back to the host as f32.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"
#include "kernels/cuda/vision_tower.h"
#include "vision/encoder.h"

namespace zest::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// A device buffer that only grows (cudaMalloc outside steady state).
template <typename T>
struct Grow {
  T* p = nullptr;
  size_t cap = 0;
  ~Grow() {
    if (p) cudaFree(p);
  }
  Status reserve(size_t n, const char* what) {
    if (n <= cap) return Status::ok();
    if (p) cudaFree(p);
    p = nullptr;
    cap = 0;
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, n * sizeof(T)), what));
    cap = n;
    return Status::ok();
  }
};

class CudaVisionEncoder final : public vision::VisionEncoder {
 public:
  ~CudaVisionEncoder() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init(const io::VisionConfig& cfg, const vision::VisionTensorSource& source) {
    ZEST_ASSIGN_OR_RETURN(tower_, VisionTowerCuda::create_from(cfg, source));
    return cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "vision stream");
  }

  const char* backend_name() const override { return "cuda"; }
  const io::VisionConfig& config() const override { return tower_->config(); }

  Result<vision::VisionEncoding> forward(const vision::PixelBatch& batch,
                                         std::optional<int64_t> score_layer) const override {
    const io::VisionConfig& cfg = tower_->config();
    const Tensor& pv = batch.pixel_values;
    const int64_t cols = tower_->in_features();
    if (batch.grids.empty()) return invalid_argument("vision forward needs at least one image grid");
    if (pv.device() != Device::CPU || pv.dtype() != DType::F32 || pv.ndim() != 2 || pv.dim(1) != cols)
      return invalid_argument("pixel_values must be a CPU f32 [patches, " + str(cols) + "] tensor, got " +
                              pv.shape_str() + " " + dtype_name(pv.dtype()));
    int64_t patches = 0;
    for (const vision::GridTHW& g : batch.grids) patches += g.patches();
    if (patches != pv.dim(0))
      return invalid_argument("pixel_values has " + str(pv.dim(0)) + " rows but the grids describe " + str(patches) +
                              " patches");
    if (score_layer && (*score_layer < 0 || *score_layer >= cfg.depth))
      return invalid_argument("score layer " + str(*score_layer) + " is outside [0, " + str(cfg.depth) + ")");

    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = static_cast<size_t>(pv.numel());
    ZEST_RETURN_IF_ERROR(pixels_f32_.reserve(n, "vision pixel buffer"));
    ZEST_RETURN_IF_ERROR(pixels_.reserve(n, "vision pixel buffer"));
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(pixels_f32_.p, pv.data<float>(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "pixel_values upload"));
    ZEST_RETURN_IF_ERROR(vision_f32_to_bf16(pixels_f32_.p, pixels_.p, n, stream_));
    ZEST_RETURN_IF_ERROR(
        tower_->forward(pixels_.p, batch.grids, score_layer ? static_cast<int>(*score_layer) : -1, stream_));
    const VisionTowerOutput& out = tower_->output();
    const size_t tokens = static_cast<size_t>(out.tokens);
    if (score_layer) {
      ZEST_RETURN_IF_ERROR(scores_.reserve(tokens, "vision score buffer"));
      ZEST_RETURN_IF_ERROR(tower_->scores(scores_.p, nullptr, stream_));
    }

    vision::VisionEncoding enc;
    enc.tokens_per_image = out.tokens_per_image;
    const int64_t O = cfg.out_hidden_size;
    ZEST_ASSIGN_OR_RETURN(enc.embeds, download(out.embeds, static_cast<int64_t>(tokens), O));
    for (const bf16* ds : out.deepstack) {
      ZEST_ASSIGN_OR_RETURN(Tensor t, download(ds, static_cast<int64_t>(tokens), O));
      enc.deepstack.push_back(std::move(t));
    }
    if (score_layer) {
      std::vector<float> flat(tokens);
      ZEST_RETURN_IF_ERROR(cuda_status(
          cudaMemcpyAsync(flat.data(), scores_.p, tokens * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "vision scores download"));
      ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "vision scores download"));
      size_t at = 0;
      for (int64_t m : enc.tokens_per_image) {
        enc.scores.emplace_back(flat.begin() + at, flat.begin() + at + m);
        at += static_cast<size_t>(m);
      }
    }
    return enc;
  }

 private:
  // Copies a device bf16 [rows, cols] matrix to a host f32 tensor (waits for the stream).
  Result<Tensor> download(const bf16* src, int64_t rows, int64_t cols) const {
    const size_t n = static_cast<size_t>(rows * cols);
    host_bits_.resize(n);
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(host_bits_.data(), src, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_),
        "vision output download"));
    ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "vision output download"));
    Tensor t = Tensor::empty({rows, cols});
    float* dst = t.data<float>();
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(host_bits_[i]);
    return t;
  }

  std::unique_ptr<VisionTowerCuda> tower_;
  cudaStream_t stream_ = nullptr;
  // One forward at a time: the tower's activations, these buffers and the stream are shared by all calls.
  mutable std::mutex mu_;
  mutable Grow<float> pixels_f32_;
  mutable Grow<bf16> pixels_;
  mutable Grow<float> scores_;
  mutable std::vector<uint16_t> host_bits_;
};

}  // namespace
}  // namespace zest::cuda

namespace zest::vision {

Result<std::unique_ptr<VisionEncoder>> create_cuda_vision_encoder(const io::VisionConfig& cfg,
                                                                  const VisionTensorSource& source) {
  if (!kernels::cuda_available())
    return unsupported("no usable CUDA GPU found (check the driver and CUDA_VISIBLE_DEVICES); use --device cpu");
  auto e = std::make_unique<cuda::CudaVisionEncoder>();
  ZEST_RETURN_IF_ERROR(e->init(cfg, source));
  return std::unique_ptr<VisionEncoder>(std::move(e));
}

}  // namespace zest::vision
