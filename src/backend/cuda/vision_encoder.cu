// vision::VisionEncoder on the CUDA vision tower: uploads the f32 pixel_values, converts them to bf16 on the
// device, runs VisionTowerCuda on a stream of its own, scores the tokens with the VisionZip score kernel and
// copies embeddings, DeepStack features and scores back to the host as f32.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda.h"
#include "backend/cuda/vision_tower.h"
#include "backend/cuda/visionzip_plan.h"
#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"
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

// A pinned host buffer that only grows.
template <typename T>
struct PinnedGrow {
  T* p = nullptr;
  size_t cap = 0;
  ~PinnedGrow() {
    if (p) cudaFreeHost(p);
  }
  Status reserve(size_t n) {
    if (n <= cap) return Status::ok();
    if (p) cudaFreeHost(p);
    p = nullptr;
    cap = 0;
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&p, n * sizeof(T)), "pinned host buffer"));
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
    std::lock_guard<std::mutex> lock(mu_);
    ZEST_RETURN_IF_ERROR(run_tower(batch, score_layer));
    const io::VisionConfig& cfg = tower_->config();
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

  bool device_resident() const override { return true; }

  Result<vision::DeviceEncoding> forward_device(const vision::PixelBatch& batch,
                                                std::optional<int64_t> score_layer) const override {
    std::lock_guard<std::mutex> lock(mu_);
    ZEST_RETURN_IF_ERROR(run_tower(batch, score_layer));
    const VisionTowerOutput& out = tower_->output();
    const int64_t T = out.tokens, O = tower_->config().out_hidden_size;
    vision::DeviceEncoding enc;
    enc.tokens_per_image = out.tokens_per_image;
    // The tower's buffers are reused by the next forward: the outputs move to tensors of their own.
    auto take = [&](const bf16* src, Tensor& dst) -> Status {
      dst = Tensor::empty({T, O}, DType::BF16, Device::CUDA);
      return cuda_status(cudaMemcpyAsync(dst.raw(), src, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_),
                         "vision output copy");
    };
    ZEST_RETURN_IF_ERROR(take(out.embeds, enc.embeds));
    for (const bf16* ds : out.deepstack) {
      Tensor t;
      ZEST_RETURN_IF_ERROR(take(ds, t));
      enc.deepstack.push_back(std::move(t));
    }
    if (score_layer) {
      enc.scores = Tensor::empty({T}, DType::F32, Device::CUDA);
      ZEST_RETURN_IF_ERROR(tower_->scores(enc.scores.data<float>(), nullptr, stream_));
    }
    ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "vision forward"));
    return enc;
  }

  Result<vision::DeviceSelection> select_device(const std::vector<vision::DeviceImageRows>& images,
                                                const vision::DeviceSelectOptions& opt) const override {
    const io::VisionConfig& cfg = tower_->config();
    const int64_t O = cfg.out_hidden_size;
    const size_t nds = cfg.deepstack_visual_indexes.size();
    if (images.empty()) return invalid_argument("select_device needs at least one image");
    const bool keep_all = !(opt.rate > 0.f) && opt.budget < 0;
    std::vector<int64_t> tokens;
    auto bad = [](const Tensor& t, int64_t rows, int64_t cols, DType dt) {
      return !t.defined() || t.device() != Device::CUDA || t.dtype() != dt ||
             (cols > 0 ? (t.ndim() != 2 || t.dim(1) != cols) : t.ndim() != 1) || (rows >= 0 && t.dim(0) != rows);
    };
    for (size_t i = 0; i < images.size(); ++i) {
      const vision::DeviceImageRows& im = images[i];
      const std::string what = "select_device: image " + str(static_cast<int64_t>(i));
      if (bad(im.embeds, -1, O, DType::BF16) || im.embeds.dim(0) <= 0)
        return invalid_argument(what + ": embeddings must be a CUDA bf16 [M, " + str(O) + "] tensor");
      const int64_t M = im.embeds.dim(0);
      if (im.deepstack.size() != nds)
        return invalid_argument(what + ": expected " + str(static_cast<int64_t>(nds)) + " DeepStack features");
      for (const Tensor& d : im.deepstack)
        if (bad(d, M, O, DType::BF16)) return invalid_argument(what + ": DeepStack rows must match the embeddings");
      if (!keep_all && bad(im.scores, M, 0, DType::F32))
        return invalid_argument(what + ": pruning needs CUDA f32 scores [M]");
      tokens.push_back(M);
    }
    using Feature = std::function<const Tensor&(const vision::DeviceImageRows&)>;
    const Feature emb = [](const vision::DeviceImageRows& im) -> const Tensor& { return im.embeds; };
    auto ds_feature = [](size_t l) {
      return Feature([l](const vision::DeviceImageRows& im) -> const Tensor& { return im.deepstack[l]; });
    };
    std::lock_guard<std::mutex> lock(mu_);
    vision::DeviceSelection sel;
    const size_t row_bytes = static_cast<size_t>(O) * sizeof(bf16);
    int64_t total = 0;
    for (int64_t M : tokens) total += M;
    if (keep_all) {
      auto concat = [&](const Feature& feature, Tensor& dst) -> Status {
        dst = Tensor::empty({total, O}, DType::BF16, Device::CUDA);
        size_t at = 0;
        for (const vision::DeviceImageRows& im : images) {
          const Tensor& src = feature(im);
          ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(static_cast<char*>(dst.raw()) + at, src.raw(), src.nbytes(),
                                                           cudaMemcpyDeviceToDevice, stream_),
                                           "vision row copy"));
          at += src.nbytes();
        }
        return Status::ok();
      };
      ZEST_RETURN_IF_ERROR(concat(emb, sel.embeds));
      for (size_t l = 0; l < nds; ++l) {
        Tensor t;
        ZEST_RETURN_IF_ERROR(concat(ds_feature(l), t));
        sel.deepstack.push_back(std::move(t));
      }
      for (int64_t M : tokens) {
        std::vector<int64_t> all(static_cast<size_t>(M));
        for (int64_t j = 0; j < M; ++j) all[j] = j;
        sel.kept.push_back(std::move(all));
      }
      ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "vision row copy"));
      return sel;
    }

    VisionZipSelect so;
    so.rate = opt.rate;
    so.global = opt.global;
    so.budget = opt.budget;
    so.min_tokens = opt.min_tokens;
    ZEST_ASSIGN_OR_RETURN(VisionZipPlan plan, visionzip_plan(tokens, so));
    const int64_t kept = plan.kept, n = static_cast<int64_t>(images.size());
    // One source matrix per feature: the images' rows when they sit back to back in one buffer (one forward),
    // else a concatenated copy in `scratch`.
    auto source = [&](const Feature& feature, size_t elem, Grow<char>& scratch, const void** out) -> Status {
      const char* base = static_cast<const char*>(feature(images[0]).raw());
      bool contiguous = true;
      size_t at = 0;
      for (const vision::DeviceImageRows& im : images) {
        contiguous = contiguous && static_cast<const char*>(feature(im).raw()) == base + at;
        at += feature(im).nbytes();
      }
      if (contiguous) {
        *out = base;
        return Status::ok();
      }
      ZEST_RETURN_IF_ERROR(scratch.reserve(static_cast<size_t>(total) * elem, "vision selection scratch"));
      at = 0;
      for (const vision::DeviceImageRows& im : images) {
        const Tensor& t = feature(im);
        ZEST_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(scratch.p + at, t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice, stream_), "vision row copy"));
        at += t.nbytes();
      }
      *out = scratch.p;
      return Status::ok();
    };
    while (cat_.size() < nds + 2) cat_.push_back(std::make_unique<Grow<char>>());
    const void* scores = nullptr;
    ZEST_RETURN_IF_ERROR(source([](const vision::DeviceImageRows& im) -> const Tensor& { return im.scores; },
                                sizeof(float), *cat_[0], &scores));
    ZEST_RETURN_IF_ERROR(ws_.reserve(std::max<size_t>(plan.workspace_bytes, 1), "VisionZip workspace"));
    ZEST_RETURN_IF_ERROR(sel_dev_.reserve(static_cast<size_t>(kept + n), "VisionZip kept indices"));
    ZEST_RETURN_IF_ERROR(sel_host_.reserve(static_cast<size_t>(kept + n)));
    ZEST_RETURN_IF_ERROR(visionzip_select(static_cast<const float*>(scores), plan, ws_.p, sel_dev_.p,
                                          sel_dev_.p + kept, nullptr, stream_));
    // The one device-to-host copy of the request: kept indices and per-image counts, back to back.
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(sel_host_.p, sel_dev_.p, static_cast<size_t>(kept + n) * 4,
                                                     cudaMemcpyDeviceToHost, stream_),
                                     "kept index copy"));
    auto gather = [&](const Feature& feature, Grow<char>& scratch, Tensor& dst) -> Status {
      const void* src = nullptr;
      ZEST_RETURN_IF_ERROR(source(feature, row_bytes, scratch, &src));
      dst = Tensor::empty({kept, O}, DType::BF16, Device::CUDA);
      return visionzip_gather_rows(static_cast<const bf16*>(src), static_cast<int>(O), sel_dev_.p,
                                   static_cast<int>(kept), static_cast<bf16*>(dst.raw()), stream_);
    };
    ZEST_RETURN_IF_ERROR(gather(emb, *cat_[1], sel.embeds));
    for (size_t l = 0; l < nds; ++l) {
      Tensor t;
      ZEST_RETURN_IF_ERROR(gather(ds_feature(l), *cat_[2 + l], t));
      sel.deepstack.push_back(std::move(t));
    }
    ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "vision selection"));
    // Global indices ascending, image by image: split them by the counts into image-local lists.
    const int32_t* idx = sel_host_.p;
    const int32_t* counts = sel_host_.p + kept;
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (counts[i] < 0 || at + counts[i] > kept) return internal_error("device selection returned bad counts");
      std::vector<int64_t> local;
      for (int32_t j = 0; j < counts[i]; ++j, ++at) {
        const int64_t g = idx[at] - plan.offsets[i];
        if (g < 0 || g >= tokens[i]) return internal_error("device selection returned an index outside its image");
        local.push_back(g);
      }
      sel.kept.push_back(std::move(local));
    }
    if (at != kept) return internal_error("device selection counts do not add up to the plan");
    return sel;
  }

  Result<Tensor> to_host(const Tensor& t) const override {
    if (!t.defined() || t.device() != Device::CUDA || (t.dtype() != DType::BF16 && t.dtype() != DType::F32) ||
        t.ndim() < 1)
      return invalid_argument("to_host takes a CUDA bf16 or f32 tensor");
    std::lock_guard<std::mutex> lock(mu_);
    if (t.dtype() == DType::F32) {
      Tensor h = Tensor::empty(t.shape());
      ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpy(h.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost), "to_host"));
      return h;
    }
    const int64_t rows = t.dim(0), cols = t.numel() / std::max<int64_t>(rows, 1);
    ZEST_ASSIGN_OR_RETURN(Tensor h, download(static_cast<const bf16*>(t.raw()), rows, cols));
    return h.reshape(t.shape());
  }

 private:
  // Validates the batch, uploads it and runs the tower (with the score capture) on stream_; mu_ held.
  Status run_tower(const vision::PixelBatch& batch, std::optional<int64_t> score_layer) const {
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
    const size_t n = static_cast<size_t>(pv.numel());
    ZEST_RETURN_IF_ERROR(pixels_f32_.reserve(n, "vision pixel buffer"));
    ZEST_RETURN_IF_ERROR(pixels_.reserve(n, "vision pixel buffer"));
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(pixels_f32_.p, pv.data<float>(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "pixel_values upload"));
    ZEST_RETURN_IF_ERROR(vision_f32_to_bf16(pixels_f32_.p, pixels_.p, n, stream_));
    return tower_->forward(pixels_.p, batch.grids, score_layer ? static_cast<int>(*score_layer) : -1, stream_);
  }

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
  // Device selection: concatenation scratch (scores, embeddings, each DeepStack feature), workspace, the kept
  // indices + counts on the device and their pinned host copy.
  mutable std::vector<std::unique_ptr<Grow<char>>> cat_;
  mutable Grow<char> ws_;
  mutable Grow<int32_t> sel_dev_;
  mutable PinnedGrow<int32_t> sel_host_;
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
