// SERE calibration on the GPU: all experts of a layer on a chunk of inputs with batched bf16 GEMMs (cuBLAS,
// f32 accumulation), then the expert-by-expert Gram of the outputs as one f64 GEMM over (token, hidden).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/sere_calibration.h"

namespace zest::kernels {
namespace {

using bf16 = __nv_bfloat16;

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string("SERE calibration: ") + what + ": " + cudaGetErrorString(e));
}
Status blas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string("SERE calibration: ") + what + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

__global__ void to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

// gu [rows, 2I] f32 (gate | up) -> h [rows, I] bf16 = silu(gate) * up.
__global__ void silu_mul_kernel(const float* __restrict__ gu, bf16* __restrict__ h, int64_t rows, int I) {
  const int64_t total = rows * I;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / I;
    const int c = static_cast<int>(i % I);
    const float g = gu[r * 2 * I + c], u = gu[r * 2 * I + I + c];
    h[i] = __float2bfloat16(g / (1.f + expf(-g)) * u);
  }
}

// One block per row of y [rows, H] f32: yd = y (f64), scaled to unit length when `cosine` (zero rows stay 0).
__global__ void widen_rows_kernel(const float* __restrict__ y, double* __restrict__ yd, int H, bool cosine) {
  const int64_t r = blockIdx.x;
  const float* src = y + r * H;
  double* dst = yd + r * H;
  double scale = 1.0;
  if (cosine) {
    __shared__ double part[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < H; i += blockDim.x) s += static_cast<double>(src[i]) * src[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += part[w];
      part[0] = t;
    }
    __syncthreads();
    const double norm = sqrt(part[0]);
    scale = norm > 0.0 ? 1.0 / norm : 0.0;
  }
  for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = static_cast<double>(src[i]) * scale;
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096)); }

class CudaExpertGram final : public ExpertGram {
 public:
  ~CudaExpertGram() override {
    for (void* p : {static_cast<void*>(xf_), static_cast<void*>(xb_), static_cast<void*>(gu_), static_cast<void*>(h_),
                    static_cast<void*>(y_), static_cast<void*>(yd_), static_cast<void*>(g_)})
      if (p) cudaFree(p);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init(int64_t E, int64_t H, int64_t I, int64_t max_tokens) {
    E_ = E, H_ = H, I_ = I, max_n_ = max_tokens;
    // Tokens per sub-chunk: keep the f64 copy of the outputs [E, sub, H] within 512 MiB.
    sub_ = std::max<int64_t>(1, std::min<int64_t>(max_tokens, (int64_t{512} << 20) / (8 * E * H)));
    ZEST_RETURN_IF_ERROR(cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"));
    ZEST_RETURN_IF_ERROR(blas_ok(cublasCreate(&blas_), "cublasCreate"));
    ZEST_RETURN_IF_ERROR(blas_ok(cublasSetStream(blas_, stream_), "cublasSetStream"));
    ZEST_RETURN_IF_ERROR(blas_ok(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    auto alloc = [](auto** p, int64_t count, const char* what) {
      return cuda_ok(cudaMalloc(reinterpret_cast<void**>(p), sizeof(**p) * static_cast<size_t>(count)), what);
    };
    ZEST_RETURN_IF_ERROR(alloc(&xf_, max_tokens * H, "inputs"));
    ZEST_RETURN_IF_ERROR(alloc(&xb_, max_tokens * H, "bf16 inputs"));
    ZEST_RETURN_IF_ERROR(alloc(&gu_, E * sub_ * 2 * I, "gate/up outputs"));
    ZEST_RETURN_IF_ERROR(alloc(&h_, E * sub_ * I, "SiLU products"));
    ZEST_RETURN_IF_ERROR(alloc(&y_, E * sub_ * H, "expert outputs"));
    ZEST_RETURN_IF_ERROR(alloc(&yd_, E * sub_ * H, "f64 expert outputs"));
    return alloc(&g_, E * E, "Gram");
  }

  Status compute(const DeviceExpertWeights& w, const float* x, int64_t n, bool cosine,
                 std::vector<double>& gram) override {
    if (!w.gate_up || !w.down) return invalid_argument("SERE calibration: the layer has no device expert weights");
    if (w.experts != E_ || w.hidden != H_ || w.inter != I_)
      return invalid_argument("SERE calibration: expert weights are [" + std::to_string(w.experts) + ", " +
                              std::to_string(w.hidden) + ", " + std::to_string(w.inter) + "], the workspace is for [" +
                              std::to_string(E_) + ", " + std::to_string(H_) + ", " + std::to_string(I_) + "]");
    if (n < 1 || n > max_n_)
      return invalid_argument("SERE calibration: " + std::to_string(n) + " tokens in a chunk (1.." +
                              std::to_string(max_n_) + " allowed)");
    const int E = static_cast<int>(E_), H = static_cast<int>(H_), I = static_cast<int>(I_);
    ZEST_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(xf_, x, sizeof(float) * static_cast<size_t>(n * H_),
                                                 cudaMemcpyHostToDevice, stream_), "input copy"));
    to_bf16_kernel<<<grid_for(n * H_), 256, 0, stream_>>>(xf_, xb_, n * H_);
    ZEST_RETURN_IF_ERROR(cuda_ok(cudaGetLastError(), "bf16 conversion"));
    const float one = 1.f, zero = 0.f;
    for (int64_t t0 = 0; t0 < n; t0 += sub_) {
      const int m = static_cast<int>(std::min(sub_, n - t0));
      // gu[e] (row-major [m, 2I]) = x[t0:t0+m] W_gu[e]^T: column-major [2I, m] = W_gu[e] (col-major [H, 2I])^T x^T.
      ZEST_RETURN_IF_ERROR(blas_ok(
          cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, m, H, &one, w.gate_up, CUDA_R_16BF, H,
                                     2LL * I * H, xb_ + t0 * H_, CUDA_R_16BF, H, 0, &zero, gu_, CUDA_R_32F, 2 * I,
                                     2LL * I * m, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "gate/up GEMM"));
      silu_mul_kernel<<<grid_for(int64_t{E} * m * I), 256, 0, stream_>>>(gu_, h_, int64_t{E} * m, I);
      ZEST_RETURN_IF_ERROR(cuda_ok(cudaGetLastError(), "SiLU product"));
      // y[e] (row-major [m, H]) = h[e] W_down[e]^T.
      ZEST_RETURN_IF_ERROR(blas_ok(
          cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, H, m, I, &one, w.down, CUDA_R_16BF, I,
                                     1LL * H * I, h_, CUDA_R_16BF, I, 1LL * m * I, &zero, y_, CUDA_R_32F, H,
                                     1LL * m * H, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "down GEMM"));
      widen_rows_kernel<<<E * m, 256, 0, stream_>>>(y_, yd_, H, cosine);
      ZEST_RETURN_IF_ERROR(cuda_ok(cudaGetLastError(), "f64 outputs"));
      // G (+)= Y Y^T with Y row-major [E, m*H], i.e. column-major [m*H, E].
      const double d_one = 1.0, beta = t0 == 0 ? 0.0 : 1.0;
      ZEST_RETURN_IF_ERROR(blas_ok(cublasDgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, E, E, m * H, &d_one, yd_, m * H, yd_,
                                               m * H, &beta, g_, E),
                                   "Gram GEMM"));
    }
    gram.resize(static_cast<size_t>(E_ * E_));
    ZEST_RETURN_IF_ERROR(cuda_ok(cudaMemcpyAsync(gram.data(), g_, sizeof(double) * gram.size(),
                                                 cudaMemcpyDeviceToHost, stream_), "Gram copy"));
    return cuda_ok(cudaStreamSynchronize(stream_), "synchronise");
  }

 private:
  int64_t E_ = 0, H_ = 0, I_ = 0, max_n_ = 0, sub_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  float* xf_ = nullptr;
  bf16* xb_ = nullptr;
  float* gu_ = nullptr;
  bf16* h_ = nullptr;
  float* y_ = nullptr;
  double* yd_ = nullptr;
  double* g_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<ExpertGram>> make_cuda_expert_gram(int64_t experts, int64_t hidden, int64_t inter,
                                                          int64_t max_tokens) {
  if (experts < 1 || hidden < 1 || inter < 1 || max_tokens < 1)
    return invalid_argument("SERE calibration: experts, hidden, inter and max_tokens must be positive");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return unsupported("SERE calibration on CUDA needs a GPU; none is usable");
  }
  auto g = std::make_unique<CudaExpertGram>();
  ZEST_RETURN_IF_ERROR(g->init(experts, hidden, inter, max_tokens));
  return std::unique_ptr<ExpertGram>(std::move(g));
}

}  // namespace zest::kernels
