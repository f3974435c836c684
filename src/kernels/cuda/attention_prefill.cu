// Prefill attention (causal, GQA, packed variable-length sequences), head_dim 128, bf16 tensor cores (wgmma),
// FlashAttention style: softmax online in fp32 and base 2 (scale pre-multiplied by log2 e), only the key tile that
// crosses the diagonal masked, the longest query tiles first. prefill_attention runs one of two kernels:
// - persistent warp-specialised (long sequences): one CTA per SM walks the (query tile, head, sequence) items; a TMA
//   producer warpgroup fills mbarrier-guarded K/V stages, two consumer warpgroups of 64 query rows take turns at
//   issuing their GEMMs, the softmax overlapping the PV GEMM;
// - pipelined wgmma (short sequences, many sequences): CTA = (query head, 128-row query tile, sequence), two
//   warpgroups of 64 rows, K/V tiles triple-buffered by cp.async, S of the next key tile issued before the softmax
//   of the current one.
// Other head dims go to prefill_attention_generic (decoder_ops.cu).
#include <cuda.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

constexpr int kD = 128;

// ---- wgmma helpers ------------------------------------------------------------------------------------------
//
// Q, K and V tiles share one shared-memory form: two 64-column blocks of 128-byte rows, 128-byte swizzled (16-byte
// chunk c of row r at chunk c ^ (r % 8)), blocks 1024-byte aligned. S = Q K^T is wgmma m64n128k16 with both operands
// K-major in shared memory; O += P V takes P from registers (the S accumulator converted in place) and V N-major
// (transposed B, leading byte offset = the distance of the two 64-column blocks).

// d (m64 x n128, fp32) += A (m64 x k16) * B (k16 x n128), both from shared memory (K-major descriptors).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}
// d += A * B with A from registers (the mma.sync m16n8k16 A fragment per warp) and B N-major in shared memory.
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// One key tile of the online softmax for a thread's two rows (the m64n128 accumulator layout): the tile's row maxima
// mx (this thread's; reduced over the quad here, then times mscale) update the running maxima m, and the running sums
// l and the output accumulator o are rescaled by exp2(m_old - m_new).
__device__ __forceinline__ void wg_online_rescale(float (&mx)[2], float (&m)[2], float (&l)[2], float (&o)[64],
                                                  float mscale) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    mx[r] *= mscale;
    const float mn = fmaxf(m[r], mx[r]);  // finite: key 0 (tile 0) precedes every row
    alpha[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

// A thread's two attention output rows, `row` and `row + 8` (sequence-relative), from its part t of the m64n128
// accumulator o: divided by the row's softmax sum (the quad's partial sums l, summed over the quad) and stored as bf16
// at token start + row, head h of Hq; rows at or past len are not stored.
__device__ __forceinline__ void store_wg_rows(const float (&o)[64], const float (&l)[2], bf16* out, int start, int row,
                                              int len, int t, int h, int Hq) {
  const size_t out_stride = static_cast<size_t>(Hq) * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int rr = row + r * 8;
    if (rr >= len) continue;
    const float inv = 1.f / lr;
    bf16* orow = out + static_cast<size_t>(start + rr) * out_stride + h * kD;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
          vmma::pack_bf16(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
  }
}

// cp.async of ROWS rows [row0, row0 + ROWS) of one head into a swizzled tile (rows >= row_end zero-filled).
template <int ROWS, int THREADS>
__device__ __forceinline__ void wg_load_tile(unsigned char* tile, const bf16* base, int stride, int row0, int row_end) {
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * 16; i += THREADS) {
    const int r = i >> 4, c = i & 15;
    const bool valid = row0 + r < row_end;
    unsigned char* dst = tile + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    vmma::cp_async16(dst, base + static_cast<size_t>(valid ? row0 + r : 0) * stride + c * 8, valid);
  }
}

// ---- Pipelined wgmma kernel ----------------------------------------------------------------------------------
//
// CTA = (query head, 128-row query tile, sequence), 2 warpgroups of 64 query rows, 128-key tiles, pipelined inside
// each warpgroup: S of tile kt + 1 is issued before the softmax of tile kt, so the softmax overlaps a wgmma. K/V
// tiles are triple-buffered (tile kt + 2 is loaded while kt and kt + 1 are in use); 224 KiB of shared memory, one
// CTA per SM. Scores stay unscaled (the max is taken on them, scale > 0) and p = exp2(s * scale - m) is one FFMA and
// EX2; the causal mask is applied to the last key tile only (with 128-row query tiles and 128-key tiles it is the
// only one that crosses the diagonal).
constexpr size_t kPipeTileBytes = static_cast<size_t>(128) * kD * sizeof(bf16);
constexpr size_t kPipeSmem = 7 * kPipeTileBytes + 1024;  // Q, K x3, V x3, alignment slack

// 2^x by ex2.approx.ftz (no denormal handling: a probability below 2^-126 becomes 0).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__global__ void __launch_bounds__(256, 1)
    prefill_attention_wgmma_pipe_kernel(const bf16* __restrict__ q, int q_stride, const bf16* __restrict__ k,
                                        const bf16* __restrict__ v, int kv_stride,
                                        const int32_t* __restrict__ cu_seqlens, bf16* __restrict__ out, int Hq, int Hkv,
                                        float scale_log2) {
  using namespace vmma;
  constexpr uint32_t kTile = kPipeTileBytes, kBlock = 128 * 128;  // bytes of a tile, of one 64-column block
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * 128;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + kTile;       // 3 tiles
  unsigned char* sV = sK + 3 * kTile;   // 3 tiles
  const uint32_t aQ = static_cast<uint32_t>(__cvta_generic_to_shared(sQ));
  const uint32_t aK = aQ + kTile, aV = aK + 3 * kTile;

  const bf16* qh = q + static_cast<size_t>(start) * q_stride + h * kD;
  const bf16* kh = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const bf16* vh = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const int q_end = min(q0 + 128, len);
  const int n_kt = (q_end + 127) / 128;  // every tile up to the diagonal: each active warpgroup has keys in all

  wg_load_tile<128, 256>(sQ, qh, q_stride, q0, len);
  wg_load_tile<128, 256>(sK, kh, kv_stride, 0, len);
  wg_load_tile<128, 256>(sV, vh, kv_stride, 0, len);
  cp_async_commit();
  if (n_kt > 1) {
    wg_load_tile<128, 256>(sK + kTile, kh, kv_stride, 128, len);
    wg_load_tile<128, 256>(sV + kTile, vh, kv_stride, 128, len);
  }
  cp_async_commit();
  cp_async_wait<1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const int row0 = q0 + wg * 64 + wq * 16;
  const uint32_t qa = aQ + wg * 64 * 128;
  // No branch while a wgmma is in flight (ptxas would serialise them): a warpgroup whose rows are all past the
  // sequence computes anyway and writes nothing, keys are masked by comparison, and the last tile is peeled.
  auto issue_s = [&](float (&acc)[64], int buf) {
    const uint32_t ka = aK + buf * kTile;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n128(acc, wg_desc(qa + (kk >> 2) * kBlock + (kk & 3) * 32, 16, 1024),
                    wg_desc(ka + (kk >> 2) * kBlock + (kk & 3) * 32, 16, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  float o[64], sc[64], sn[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Softmax of tile kt (scores in sc), then O += P V of tile kt issued (committed, not waited for); last: the
  // diagonal tile, masked.
  auto softmax_pv = [&](int kt, float (&sv)[64], auto last) {
    constexpr bool kMask = decltype(last)::value;
    const int k0 = kt * 128;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sv[4 * i + e];
        if (kMask && k0 + 8 * i + 2 * t + (e & 1) > row0 + g + (e >> 1) * 8) x = -INFINITY;
        sv[4 * i + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    wg_online_rescale(mx, m, l, o, scale_log2);
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p[e] = exp2f(fmaf(sv[4 * i + e], scale_log2, -m[e >> 1]));
      l[0] += p[0] + p[1];
      l[1] += p[2] + p[3];
      pa[i / 2][(i % 2) * 2] = pack_bf16(p[0], p[1]);
      pa[i / 2][(i % 2) * 2 + 1] = pack_bf16(p[2], p[3]);
    }
    const uint32_t va = aV + (kt % 3) * kTile;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_rs_tb(o, pa[kk], wg_desc(va + kk * 16 * 128, kBlock, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };

  issue_s(sc, 0);
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // One key tile with scores in cur: S of tile kt + 1 into nxt (runs on the tensor cores during the softmax),
  // softmax and O += P V of tile kt, then both waited for.
  auto step = [&](int kt, float (&cur)[64], float (&nxt)[64]) {
    cp_async_wait<0>();  // tile kt + 1
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // every warpgroup is done with tile kt - 1: its buffer takes tile kt + 2
    if (kt + 2 < n_kt) {
      const int b = (kt + 2) % 3;
      wg_load_tile<128, 256>(sK + b * kTile, kh, kv_stride, (kt + 2) * 128, len);
      wg_load_tile<128, 256>(sV + b * kTile, vh, kv_stride, (kt + 2) * 128, len);
    }
    cp_async_commit();
    issue_s(nxt, (kt + 1) % 3);
    softmax_pv(kt, cur, std::false_type{});
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  };
  for (int kt = 0; kt + 1 < n_kt; ++kt) {
    step(kt, sc, sn);
#pragma unroll
    for (int i = 0; i < 64; ++i) sc[i] = sn[i];
  }
  softmax_pv(n_kt - 1, sc, std::true_type{});
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

  store_wg_rows(o, l, out, start, row0 + g, len, t, h, Hq);
}

Status launch_wgmma_pipe(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale,
                         cudaStream_t stream) {
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(prefill_attention_wgmma_pipe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(kPipeSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (wgmma, pipelined) smem attribute"));
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(Hq, (max_seqlen + 127) / 128, nseq);
  return launch("prefill_attention", prefill_attention_wgmma_pipe_kernel, grid, dim3(256), kPipeSmem, stream, q,
                q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, scale * kLog2e);
}

// ---- Persistent warp-specialised kernel (FlashAttention-3 style) ----------------------------------------------
//
// Three warpgroups: warpgroup 0 is the producer (TMA loads of the Q tile and of the K and V tiles into a ring of
// mbarrier-guarded stages, its registers cut by setmaxnreg), warpgroups 1 and 2 are consumers of 64 query rows each.
// Key tiles of 128 run from the diagonal tile (the only one masked) down to tile 0. Per key tile a consumer issues
// S = Q K^T of this tile and O += P V of the previous one, then the softmax of S runs while the PV GEMM is in flight
// (P stays in registers as the A operand, O is rescaled once the GEMM is done). The two consumers take turns at
// issuing their GEMMs (named barriers 1 and 2), so one warpgroup's softmax overlaps the other's GEMMs. K and V live
// in the qkv buffer with a row stride: the tensor maps are 3-D (64 columns, 128-byte column blocks of the heads,
// token rows), one box = 64 columns x 128 rows, 128-byte swizzled: the shared-memory form above. Tiles that reach
// past a sequence end are copied by the producer warps with cp.async instead, so TMA never reads a row outside the
// sequences (the host does not know the total token count).

constexpr int kWsThreads = 384;
constexpr int kWsMinSeqlen = 256;  // prefill_attention takes the persistent kernel above this max_seqlen
constexpr uint32_t kWsTile = 128 * kD * sizeof(bf16);  // bytes of one 128-row tile (two 64-column blocks)
constexpr uint32_t kWsBlock = 128 * 128;               // bytes of one 64-column block of a tile

// Two TMA boxes (the 64-column blocks) of one 128-row tile: rows [row, row + 128) of head `head`.
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int head, int row) {
#pragma unroll
  for (int b = 0; b < 2; ++b)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
            dst + b * kWsBlock),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(0), "r"(2 * head + b), "r"(row)
        : "memory");
}
// d (m64 x n128, fp32) = (accumulate ? d : 0) + A * B, both from shared memory (K-major descriptors).
__device__ __forceinline__ void wgmma_ss_n128_acc(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The consumer warpgroups' steps.
// Turn-taking at issuing GEMMs: consumer cw waits on barrier 1 + cw, then lets the other go.
__device__ __forceinline__ void ws_sched_sync(int cw) { named_bar_sync(1 + cw, 256); }
__device__ __forceinline__ void ws_sched_arrive(int cw) { named_bar_arrive(2 - cw, 256); }
// One arrival per warp on a ring slot's empty barrier.
__device__ __forceinline__ void ws_release(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
// acc = Q K^T of a consumer's 64 query rows (shared address qa) against the 128-key tile at ka.
__device__ __forceinline__ void ws_issue_s(float (&acc)[64], uint32_t qa, uint32_t ka) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wgmma_ss_n128_acc(acc, wg_desc(qa + (kk >> 2) * kWsBlock + (kk & 3) * 32, 16, 1024),
                      wg_desc(ka + (kk >> 2) * kWsBlock + (kk & 3) * 32, 16, 1024), kk > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// o += P V with P (bf16, packed by ws_pack_p) in registers and the 128-row V tile at va.
__device__ __forceinline__ void ws_issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], uint32_t va) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_rs_tb(o, pa[kk], wg_desc(va + kk * 16 * 128, kWsBlock, 1024));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// The first (diagonal) key tile's softmax of a consumer warp: scores sv of query rows row0 + g (+ 8) against keys
// kdiag + 8 i + 2 t (+ 1) masked causally, the running maxima m and sums l started from this tile, sv replaced by
// exp2(sv * scale_log2 - m) (exp2 with flush to zero).
__device__ __forceinline__ void ws_first_tile_softmax(float (&sv)[64], float (&m)[2], float (&l)[2], int kdiag,
                                                      int row0, int g, int t, float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sv[4 * i + e];
      if (kdiag + 8 * i + 2 * t + (e & 1) > row0 + g + (e >> 1) * 8) x = -INFINITY;
      sv[4 * i + e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    m[r] = mx[r] * scale_log2;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    sv[i] = exp2_ftz(fmaf(sv[i], scale_log2, -m[(i >> 1) & 1]));
    l[(i >> 1) & 1] += sv[i];
  }
}
// The online softmax over a later key tile (no mask): the row maxima of sv (scores) folded into m (log2 units),
// alpha = the factor for the previous output and sums, l rescaled and the tile's numerators added (exp2 with flush
// to zero); sv becomes them.
__device__ __forceinline__ void ws_tile_softmax(float (&sv)[64], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 64; ++j) mx[(j >> 1) & 1] = fmaxf(mx[(j >> 1) & 1], sv[j]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r] * scale_log2);
    alpha[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const float x = fmaf(sv[j], scale_log2, -m[(j >> 1) & 1]);
    sv[j] = exp2_ftz(x);
    l[(j >> 1) & 1] += sv[j];
  }
}
// The softmax numerators sv (fp32 accumulator layout) as bf16 A fragments.
__device__ __forceinline__ void ws_pack_p(uint32_t (&pa)[8][4], const float (&sv)[64]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pa[i / 2][(i % 2) * 2] = vmma::pack_bf16(sv[4 * i], sv[4 * i + 1]);
    pa[i / 2][(i % 2) * 2 + 1] = vmma::pack_bf16(sv[4 * i + 2], sv[4 * i + 3]);
  }
}

// Tensor map of `heads` heads of 128 columns at base + row * stride: dims (64 columns, 2 * heads column
// blocks, rows), boxes of 64 columns x 128 rows, 128-byte swizzle.
Status head_tensor_map(CUtensorMap* map, const bf16* base, int heads, int stride, uint64_t rows) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return unsupported("prefill_attention: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(2 * heads), rows};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(stride) * sizeof(bf16)};
  const cuuint32_t box[3] = {64, 1, 128};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides, box,
                            estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return internal_error("prefill_attention: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                          ")");
  return Status::ok();
}

// One CTA per SM walks the (query tile, head, sequence) items, longest query tiles first, in a snake order (round r of gridDim.x items runs forward when r is
// even, backward when odd, so every CTA gets a similar total length). The K/V ring runs on across items, and the
// output goes through its own shared tile, so the producer loads the next item's Q as soon as the last S GEMM of
// the current one is done and its K/V tiles as soon as stages free up: the next item's loads overlap the current
// item's last PV GEMM and epilogue. STAGES = 2 (Q, O and two K/V stages: 192 KiB). Producer warpgroup at 56
// registers, consumers at 224. Exponentials by ex2.approx.ftz; the O rescale is skipped when no row of a warp changed
// its maximum.
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_attention_wsp_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                 const __grid_constant__ CUtensorMap tm_v, const bf16* __restrict__ q, int q_stride,
                                 const bf16* __restrict__ k, const bf16* __restrict__ v, int kv_stride,
                                 const int32_t* __restrict__ cu_seqlens, bf16* __restrict__ out, int Hq, int Hkv,
                                 int q_tiles, int nseq, float scale_log2) {
  using namespace vmma;
  constexpr int STAGES = 2;
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t aQ = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t aO = aQ + kWsTile, aK = aO + kWsTile, aV = aK + STAGES * kWsTile, aBar = aV + STAGES * kWsTile;
  const uint32_t q_full = aBar, q_empty = aBar + 8;
  auto k_full = [&](int s) { return aBar + 8 * (2 + s); };
  auto v_full = [&](int s) { return aBar + 8 * (2 + STAGES + s); };
  auto k_empty = [&](int s) { return aBar + 8 * (2 + 2 * STAGES + s); };
  auto v_empty = [&](int s) { return aBar + 8 * (2 + 3 * STAGES + s); };
  if (threadIdx.x == 0) {
    mbar_init_count(q_full, 1);
    mbar_init_count(q_empty, 8);  // one arrival per consumer warp
    for (int s = 0; s < STAGES; ++s) {
      mbar_init_count(k_full(s), 1);
      mbar_init_count(v_full(s), 1);
      mbar_init_count(k_empty(s), 8);
      mbar_init_count(v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
  const int G = gridDim.x, b = blockIdx.x;
  // Item of round r for this CTA: false when the round has none; else its head, query tile and sequence. An item
  // is one head x 128 query rows (consumer c takes rows 64c .. 64c + 63).
  const int total = Hq * q_tiles * nseq;
  auto item = [&](int r, int& h, int& qt, int& seq) {
    const int w = r * G + ((r & 1) ? G - 1 - b : b);
    if (w >= total) return false;
    const int per_tile = Hq * nseq;
    qt = q_tiles - 1 - w / per_tile;  // longest query tiles first
    seq = (w % per_tile) / Hq;
    h = w % Hq;
    return true;
  };
  const int rounds = (total + G - 1) / G;

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    // Warp 0 waits for free stages and issues the TMA loads (lane 0); tiles that reach past a sequence end are
    // copied by all four producer warps with cp.async (named barrier 5 brackets each such copy): rows past the
    // end are not read; a V tile's are zeroed (P is 0 there, and 0 * V must stay 0), a Q or K tile's keep stale
    // data (K: those keys are masked; Q: those rows are never written out).
    const int pt = threadIdx.x, pw = pt >> 5;
    uint32_t kit = 0, vit = 0, qi = 0;  // K tiles, V tiles and items loaded so far
    for (int r = 0; r < rounds; ++r) {
      int h, qt, seq;
      if (!item(r, h, qt, seq)) continue;
      const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start, q0 = qt * 128;
      if (q0 >= len) continue;
      const int kvh = h / (Hq / Hkv), n_kt = q0 / 128 + 1;
      const bool q_partial = q0 + 128 > len, kv_partial = n_kt * 128 > len;
      const bf16* kb = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
      const bf16* vb = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
      const bf16* qb = q + static_cast<size_t>(start) * q_stride + h * kD;
      // cp.async of `rows` rows from row0 into dst by the 128 producer threads, then bar arrives once.
      auto copy_rows = [&](uint32_t dst, const bf16* base, int stride, int row0, int rows, bool zero_rest) {
        for (int i = pt; i < rows * 16; i += 128) {
          const int rr = i >> 4, c = i & 15;
          const uint32_t d = dst + (c >> 3) * kWsBlock + rr * 128 + (((c & 7) ^ (rr & 7)) << 4);
          if (row0 + rr < len) {
            const bf16* src = base + static_cast<size_t>(row0 + rr) * stride + c * 8;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
          } else if (zero_rest) {
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(d), "r"(0) : "memory");
          }
        }
      };
      auto copy_done = [&](uint32_t bar) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_bar_sync(5, 128);
        if (pt == 0) mbar_arrive(bar);
      };
      // One K or V tile: TMA when whole, else the shared copy.
      auto load = [&](uint32_t dst, uint32_t bar, const CUtensorMap* map, const bf16* base, int row0, bool cp,
                      bool zero_rest) {
        if (cp) {
          named_bar_sync(5, 128);  // warp 0 has seen the stage free
          copy_rows(dst, base, kv_stride, row0, 128, zero_rest);
          copy_done(bar);
        } else if (pt == 0) {
          mbar_arrive_expect_tx(bar, kWsTile);
          tma_tile(dst, map, bar, kvh, start + row0);
        }
      };
      // The Q tile.
      auto load_q = [&]() {
        if (q_partial) {
          named_bar_sync(5, 128);
          copy_rows(aQ, qb, q_stride, q0, 128, false);
          copy_done(q_full);
        } else if (pt == 0) {
          mbar_arrive_expect_tx(q_full, kWsTile);
          tma_tile(aQ, &tm_q, q_full, h, start + q0);
        }
      };
      auto load_k = [&](int i) {
        const int s = kit % STAGES;
        if (pw == 0 && kit >= STAGES) mbar_wait(k_empty(s), ((kit / STAGES) - 1) & 1);
        load(aK + s * kWsTile, k_full(s), &tm_k, kb, (n_kt - 1 - i) * 128, kv_partial && i == 0, false);
        ++kit;
      };
      auto load_v = [&](int i) {
        const int s = vit % STAGES;
        if (pw == 0 && vit >= STAGES) mbar_wait(v_empty(s), ((vit / STAGES) - 1) & 1);
        load(aV + s * kWsTile, v_full(s), &tm_v, vb, (n_kt - 1 - i) * 128, kv_partial && i == 0, true);
        ++vit;
      };
      if (pw == 0 && qi > 0) mbar_wait(q_empty, (qi - 1) & 1);
      load_q();
      ++qi;
      load_k(0);
      for (int i = 1; i <= n_kt; ++i) {
        if (i < n_kt) load_k(i);
        load_v(i - 1);
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const uint32_t qa = aQ + cw * 64 * 128, oa = aO + cw * 64 * 128;
  auto sched_sync = [&]() { ws_sched_sync(cw); };
  auto sched_arrive = [&]() { ws_sched_arrive(cw); };
  auto release = [&](uint32_t bar) { ws_release(bar, lane); };
  auto issue_s = [&](float (&acc)[64], int s) { ws_issue_s(acc, qa, aK + s * kWsTile); };
  float o[64], sv[64];
  uint32_t pa[8][4];
  auto issue_pv = [&](int s) { ws_issue_pv(o, pa, aV + s * kWsTile); };
  auto pack_p = [&]() { ws_pack_p(pa, sv); };
  const size_t out_stride = static_cast<size_t>(Hq) * kD;
  uint32_t kit = 0, vit = 0, qi = 0;
  for (int r = 0; r < rounds; ++r) {
    int h, qt, seq;
    if (!item(r, h, qt, seq)) continue;
    const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start, q0 = qt * 128;
    if (q0 >= len) continue;
    const int n_kt = q0 / 128 + 1, kdiag = (n_kt - 1) * 128;
    const int rbase = q0 + cw * 64;  // this consumer's first query row
    const int row0 = rbase + warp * 16;
    if (cw == 1) {
      named_bar_arrive(1, 256);  // consumer 0 goes first
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m[2], l[2] = {0.f, 0.f};
    mbar_wait(q_full, qi & 1);
    ++qi;
    {
      const int s = kit % STAGES;
      mbar_wait(k_full(s), (kit / STAGES) & 1);
      sched_sync();
      issue_s(sv, s);
      sched_arrive();
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      release(k_empty(s));
      ++kit;
      if (n_kt == 1) release(q_empty);
      ws_first_tile_softmax(sv, m, l, kdiag, row0, g, t, scale_log2);
      pack_p();
    }
    for (int i = 1; i < n_kt; ++i) {
      const int s = kit % STAGES, ps = vit % STAGES;
      mbar_wait(k_full(s), (kit / STAGES) & 1);
      sched_sync();
      issue_s(sv, s);
      mbar_wait(v_full(ps), (vit / STAGES) & 1);
      issue_pv(ps);
      sched_arrive();
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S done, PV in flight
      release(k_empty(s));
      ++kit;
      if (i == n_kt - 1) release(q_empty);  // last S GEMM of the item: Q may be replaced
      float alpha[2];
      ws_tile_softmax(sv, m, l, alpha, scale_log2);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // PV of tile i - 1 done
      release(v_empty(ps));
      ++vit;
      // The rescale is skipped when no row of the warp changed its maximum.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < 64; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
      pack_p();
    }
    {
      const int ps = vit % STAGES;
      mbar_wait(v_full(ps), (vit / STAGES) & 1);
      sched_sync();
      issue_pv(ps);
      if (cw == 0) sched_arrive();  // consumer 1's last turn of the item hands over to nobody
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      release(v_empty(ps));
      ++vit;
    }
    // Epilogue through this consumer's 64 rows of the O tile (the previous item's reads of them are done once
    // every warp of the warpgroup passed the first barrier).
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
      l[rr] = 1.f / l[rr];
    }
    named_bar_sync(3 + cw, 128);
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int row = warp * 16 + g + 8 * rr;
        const uint32_t addr = oa + (i >> 3) * kWsBlock + row * 128 + (((i & 7) ^ (row & 7)) << 4) + 4 * t;
        const uint32_t val = pack_bf16(o[4 * i + 2 * rr] * l[rr], o[4 * i + 2 * rr + 1] * l[rr]);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(val) : "memory");
      }
    named_bar_sync(3 + cw, 128);
    const int ct = threadIdx.x & 127;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int c = ct + 128 * it, rr = c >> 4, ch = c & 15;
      const int row = rbase + rr;
      uint4 val;
      const uint32_t addr = oa + (ch >> 3) * kWsBlock + rr * 128 + (((ch & 7) ^ (rr & 7)) << 4);
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(addr));
      if (row < len)
        *reinterpret_cast<uint4*>(out + static_cast<size_t>(start + row) * out_stride + h * kD + ch * 8) = val;
    }
  }
}

Status launch_wsp(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, const int32_t* cu_seqlens,
                  int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr size_t smem = static_cast<size_t>(6) * kWsTile + 1024 + 256;  // Q, O, 2 x K/V, alignment, barriers
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(prefill_attention_wsp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (persistent) smem attribute"));
  int dev = 0, sms = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiprocessor count"));
  const uint64_t rows = static_cast<uint64_t>(nseq) * static_cast<uint64_t>(max_seqlen);
  CUtensorMap tq, tk, tv;
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tq, q, Hq, q_stride, rows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tk, k, Hkv, kv_stride, rows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tv, v, Hkv, kv_stride, rows));
  constexpr float kLog2e = 1.4426950408889634f;
  const int q_tiles = (max_seqlen + 127) / 128;
  const int64_t items = static_cast<int64_t>(Hq) * q_tiles * nseq;
  const int grid = static_cast<int>(std::min<int64_t>(items, sms));
  return launch("prefill_attention", prefill_attention_wsp_kernel, dim3(grid), dim3(kWsThreads), smem,
                stream, tq, tk, tv, q, q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, q_tiles, nseq,
                scale * kLog2e);
}

Status check_prefill(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, int nseq,
                     int max_seqlen, const bf16* out, int Hq, int Hkv) {
  if (nseq <= 0 || max_seqlen <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    return invalid_argument("prefill_attention: need nseq, max_seqlen, heads > 0 and Hq divisible by Hkv");
  if (q_stride % 8 != 0 || kv_stride % 8 != 0)
    return invalid_argument("prefill_attention: row strides must be multiples of 8 elements");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
       reinterpret_cast<uintptr_t>(out)) % 16 != 0)
    return invalid_argument("prefill_attention: q, k, v and out must be 16-byte aligned");
  return Status::ok();
}

}  // namespace

Status prefill_attention(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                         float scale, cudaStream_t stream) {
  if (D != kD)
    return prefill_attention_generic(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, D, scale,
                                     stream);
  ZEST_RETURN_IF_ERROR(check_prefill(q, q_stride, k, v, kv_stride, nseq, max_seqlen, out, Hq, Hkv));
  // The persistent kernel for long sequences (H200, T = 8192: 698 TFLOP/s against 430 for the pipelined kernel);
  // the pipelined kernel for short ones, where the fixed cost of a CTA dominates, and for many short sequences
  // (mixed batches of decode tokens and a chunk), where the persistent kernel's items would be mostly one-tile copies.
  if (max_seqlen > kWsMinSeqlen && static_cast<int64_t>(nseq) * 128 <= max_seqlen)
    return launch_wsp(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale, stream);
  return launch_wgmma_pipe(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale, stream);
}

}  // namespace zest::cuda
