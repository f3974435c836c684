// VisionZip token selection and gathers on the device. Per image, a CUB segmented radix sort of
// (score descending, index ascending) keys gives every token its rank. Uniform mode keeps ranks < k_i
// (k_i known on the host). Global mode keeps the floors and gives the shared budget to the best
// normalised scores: a candidate's global rank is counted exactly by binary searches in the other
// images' sorted lists, ties to the lower image then the lower index, as accel::vision_keep_counts.
// Kept flags are scanned into ascending index lists. The only host wait is the optional counts copy.
// The plan (the counts that do not depend on scores) is made above the kernels, by
// backend/cuda/visionzip_plan.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"

namespace zest::cuda {

namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Workspace layout of one selection (byte offsets from the workspace start).
struct Layout {
  size_t keys_in, keys_out, flags, scan, meta, factor, temp, temp_bytes, total;
};

Layout layout(int64_t T, int64_t n, size_t temp_bytes) {
  Layout l{};
  size_t o = 0;
  l.keys_in = o;
  o += align256(T * sizeof(uint64_t));
  l.keys_out = o;
  o += align256(T * sizeof(uint64_t));
  l.flags = o;
  o += align256(T * sizeof(int32_t));
  l.scan = o;
  o += align256(T * sizeof(int32_t));
  l.meta = o;
  o += align256((3 * n + 1) * sizeof(int32_t));
  l.factor = o;
  o += align256(n * sizeof(double));
  l.temp = o;
  l.temp_bytes = temp_bytes;
  o += align256(temp_bytes);
  l.total = o;
  return l;
}

// Image holding flat token p: the last image whose offset is <= p.
__device__ __forceinline__ int image_of(const int32_t* offsets, int n, int p) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= p)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sort key: (order of the score, descending) in the high word, the local index in the low word. Scores
// > 0 map to their bits + 1, zero (either sign) and negatives to 1, NaN to 0: NaN ranks last.
__global__ void keys_kernel(const float* __restrict__ scores, const int32_t* __restrict__ offsets, int n, int T,
                            uint64_t* __restrict__ keys) {
  pdl_wait();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= T) return;
  const float s = scores[p];
  uint32_t u = 0;
  if (!isnan(s)) u = s > 0.f ? __float_as_uint(s) + 1u : 1u;
  const int img = image_of(offsets, n, p);
  keys[p] = (static_cast<uint64_t>(~u) << 32) | static_cast<uint32_t>(p - offsets[img]);
}

__device__ __forceinline__ float key_score(uint64_t key) {
  const uint32_t u = ~static_cast<uint32_t>(key >> 32);
  if (u == 0) return __uint_as_float(0x7fc00000u);
  return u == 1 ? 0.f : __uint_as_float(u - 1u);
}

// factor[i] = M_i / sum of image i's scores (1 when the sum is 0), summed in f64 in index order.
__global__ void factor_kernel(const float* __restrict__ scores, const int32_t* __restrict__ offsets, int n,
                              double* __restrict__ factor) {
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double sum = 0.0;
  for (int p = offsets[i]; p < offsets[i + 1]; ++p) sum += static_cast<double>(scores[p]);
  const int m = offsets[i + 1] - offsets[i];
  factor[i] = sum > 0.0 ? static_cast<double>(m) / sum : 1.0;
}

// Number of candidates of image i (sorted positions [offsets[i] + floors[i], offsets[i + 1])) whose
// normalised score is > v (or >= v when `or_equal`).
__device__ int count_better(const uint64_t* sorted, const int32_t* offsets, const int32_t* floors, const double* factor,
                            int i, double v, bool or_equal) {
  int lo = offsets[i] + floors[i], hi = offsets[i + 1];
  const int begin = lo;
  while (lo < hi) {  // first position that is not better
    const int mid = (lo + hi) / 2;
    const double k = static_cast<double>(key_score(sorted[mid])) * factor[i];
    const bool better = or_equal ? k >= v : k > v;
    if (better)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - begin;
}

__global__ void select_kernel(const uint64_t* __restrict__ sorted, const int32_t* __restrict__ meta, int n, int T,
                              int global, int64_t extra, const double* __restrict__ factor, int32_t* __restrict__ flags,
                              int32_t* __restrict__ counts) {
  pdl_wait();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= T) return;
  const int32_t* offsets = meta;
  const int32_t* floors = meta + n + 1;
  const int32_t* fixed = meta + 2 * n + 1;
  const int img = image_of(offsets, n, p);
  const int r = p - offsets[img];
  const uint32_t local = static_cast<uint32_t>(sorted[p]);
  bool kept;
  if (!global) {
    kept = r < fixed[img];
  } else if (r < floors[img]) {
    kept = true;
  } else {
    const double v = static_cast<double>(key_score(sorted[p])) * factor[img];
    int64_t rank = r - floors[img];
    for (int i = 0; i < n && rank < extra; ++i) {
      if (i != img) rank += count_better(sorted, offsets, floors, factor, i, v, i < img);
    }
    kept = rank < extra;
    if (kept) atomicAdd(&counts[img], 1);
  }
  flags[offsets[img] + local] = kept ? 1 : 0;
}

__global__ void scatter_kernel(const int32_t* __restrict__ flags, const int32_t* __restrict__ pos, int T,
                               int32_t* __restrict__ kept_index) {
  pdl_wait();
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g < T && flags[g]) kept_index[pos[g]] = g;
}

__global__ void gather_rows_kernel(const bf16* __restrict__ src, int dim, const int32_t* __restrict__ index,
                                   bf16* __restrict__ dst) {
  pdl_wait();
  const int n = blockIdx.x;
  const bf16* s = src + static_cast<size_t>(index[n]) * dim;
  bf16* d = dst + static_cast<size_t>(n) * dim;
  if (dim % 8 == 0) {
    for (int i = threadIdx.x; i < dim / 8; i += blockDim.x)
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
  }
}

__global__ void gather_columns_kernel(const int32_t* __restrict__ src, int rows, int src_cols,
                                      const int32_t* __restrict__ index, int index_offset, int n_out,
                                      int32_t* __restrict__ dst) {
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * n_out) return;
  const int r = i / n_out, n = i % n_out;
  dst[i] = src[static_cast<size_t>(r) * src_cols + index[n] + index_offset];
}

size_t cub_temp_bytes(int T, int n) {
  size_t sort_bytes = 0, scan_bytes = 0;
  cub::DeviceSegmentedRadixSort::SortKeys(nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr),
                                          static_cast<uint64_t*>(nullptr), T, n, static_cast<const int32_t*>(nullptr),
                                          static_cast<const int32_t*>(nullptr), 0, 64);
  cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                static_cast<int32_t*>(nullptr), T);
  return std::max(sort_bytes, scan_bytes);
}

}  // namespace

size_t visionzip_workspace_bytes(int64_t tokens, int64_t images) {
  const int T = static_cast<int>(tokens), n = static_cast<int>(images);
  return layout(T, n, cub_temp_bytes(T, n)).total;
}

Status visionzip_select(const float* token_scores, const VisionZipPlan& plan, void* workspace, int32_t* kept_index,
                        int32_t* kept_counts, int64_t* host_counts, cudaStream_t stream) {
  if (!token_scores || !workspace || !kept_index || !kept_counts)
    return invalid_argument("visionzip_select: null pointer");
  if (plan.tokens.empty() || plan.workspace_bytes == 0)
    return invalid_argument("visionzip_select: the plan is empty; build it with visionzip_plan");
  const int T = static_cast<int>(plan.total), n = static_cast<int>(plan.tokens.size());
  const Layout l = layout(T, n, cub_temp_bytes(T, n));
  if (l.total > plan.workspace_bytes)
    return invalid_argument("visionzip_select: workspace smaller than the plan needs");
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint64_t*>(ws + l.keys_in);
  auto* keys_out = reinterpret_cast<uint64_t*>(ws + l.keys_out);
  auto* flags = reinterpret_cast<int32_t*>(ws + l.flags);
  auto* scan = reinterpret_cast<int32_t*>(ws + l.scan);
  auto* meta = reinterpret_cast<int32_t*>(ws + l.meta);
  auto* factor = reinterpret_cast<double*>(ws + l.factor);
  void* temp = ws + l.temp;

  std::vector<int32_t> host_meta;
  host_meta.reserve(3 * n + 1);
  for (int64_t o : plan.offsets) host_meta.push_back(static_cast<int32_t>(o));
  host_meta.push_back(T);
  for (int64_t f : plan.floors) host_meta.push_back(static_cast<int32_t>(f));
  for (int64_t c : plan.counts) host_meta.push_back(static_cast<int32_t>(c));
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(meta, host_meta.data(), host_meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
      "visionzip_select meta upload"));
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(kept_counts, meta + 2 * n + 1, n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream),
                  "visionzip_select counts init"));
  const int threads = 256, blocks = (T + threads - 1) / threads;
  ZEST_RETURN_IF_ERROR(
      launch("visionzip_keys", keys_kernel, dim3(blocks), dim3(threads), 0, stream, token_scores, meta, n, T, keys_in));
  size_t temp_bytes = l.temp_bytes;
  ZEST_RETURN_IF_ERROR(
      cuda_status(cub::DeviceSegmentedRadixSort::SortKeys(temp, temp_bytes, static_cast<const uint64_t*>(keys_in),
                                                          keys_out, T, n, static_cast<const int32_t*>(meta),
                                                          static_cast<const int32_t*>(meta + 1), 0, 64, stream),
                  "visionzip_select segmented sort"));
  if (plan.global) {
    ZEST_RETURN_IF_ERROR(launch("visionzip_factor", factor_kernel, dim3((n + 127) / 128), dim3(128), 0, stream,
                                token_scores, meta, n, factor));
  }
  ZEST_RETURN_IF_ERROR(launch("visionzip_select", select_kernel, dim3(blocks), dim3(threads), 0, stream, keys_out, meta,
                              n, T, plan.global ? 1 : 0, plan.extra, factor, flags, kept_counts));
  temp_bytes = l.temp_bytes;
  ZEST_RETURN_IF_ERROR(
      cuda_status(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, static_cast<const int32_t*>(flags), scan, T, stream),
                  "visionzip_select scan"));
  ZEST_RETURN_IF_ERROR(
      launch("visionzip_scatter", scatter_kernel, dim3(blocks), dim3(threads), 0, stream, flags, scan, T, kept_index));
  if (host_counts) {
    std::vector<int32_t> c(n);
    ZEST_RETURN_IF_ERROR(
        cuda_status(cudaMemcpyAsync(c.data(), kept_counts, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                    "visionzip_select counts copy"));
    ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "visionzip_select sync"));
    for (int i = 0; i < n; ++i) host_counts[i] = c[i];
  }
  return Status::ok();
}

Status visionzip_gather_rows(const bf16* src, int dim, const int32_t* index, int n_out, bf16* dst,
                             cudaStream_t stream) {
  if (dim <= 0 || n_out < 0) return invalid_argument("visionzip_gather_rows: dim must be positive");
  if (n_out == 0) return Status::ok();
  if (dim % 8 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 != 0)
    return invalid_argument("visionzip_gather_rows: src and dst must be 16-byte aligned");
  return launch("visionzip_gather_rows", gather_rows_kernel, dim3(n_out), dim3(128), 0, stream, src, dim, index, dst);
}

Status visionzip_gather_columns(const int32_t* src, int rows, int src_cols, const int32_t* index, int index_offset,
                                int n_out, int32_t* dst, cudaStream_t stream) {
  if (rows <= 0 || src_cols <= 0 || n_out < 0)
    return invalid_argument("visionzip_gather_columns: rows and src_cols must be positive");
  if (n_out == 0) return Status::ok();
  const int total = rows * n_out;
  return launch("visionzip_gather_columns", gather_columns_kernel, dim3((total + 255) / 256), dim3(256), 0, stream, src,
                rows, src_cols, index, index_offset, n_out, dst);
}

}  // namespace zest::cuda
