// Tensor-core building blocks shared by the vision attention and VisionZip score kernels: cp.async tile
// loads, ldmatrix and mma.sync m16n8k16 (bf16 in, fp32 accumulate).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace zest::cuda::vmma {

constexpr int kTile = 64;      // rows (queries or keys) per tile
constexpr int kThreads = 128;  // 4 warps, 16 rows each

// Padded row stride of a shared tile with dp (multiple of 16) columns: dp + 8 bf16 keeps ldmatrix rows on
// distinct banks.
__host__ __device__ constexpr int row_stride(int dp) { return dp + 8; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; zero-fills when !valid (gmem is then not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b for one m16n8k8 tile (the odd 8-wide tail of a head dimension).
__device__ __forceinline__ void mma1688(float (&d)[4], const uint32_t (&a)[2], uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b0));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// One online-softmax step of an m16 tile of scores s (log2 units, masked keys at -inf) whose per-thread row maxima
// are mx: the maxima reduced over the quad, the running maxima m raised (finite once a row has seen one key), the
// running sums l and the output tiles o rescaled by exp2(m_old - m_new), this tile's exp2(s - m) added to l and packed
// as bf16 A fragments pa for the PV product.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_step(const float (&s)[NT][4], float (&mx)[2], float (&m)[2],
                                                    float (&l)[2], float (&o)[DT][4], uint32_t (&pa)[NT / 2][4]) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r]);
    alpha[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < DT; ++i) {
    o[i][0] *= alpha[0];
    o[i][1] *= alpha[0];
    o[i][2] *= alpha[1];
    o[i][3] *= alpha[1];
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const float p0 = exp2f(s[j][0] - m[0]), p1 = exp2f(s[j][1] - m[0]);
    const float p2 = exp2f(s[j][2] - m[1]), p3 = exp2f(s[j][3] - m[1]);
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    pa[j / 2][(j % 2) * 2] = pack_bf16(p0, p1);
    pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(p2, p3);
  }
}

// Loads `rows` rows [row0, row0 + rows) of one head (d columns, d % 8 == 0) into a shared tile of row stride
// S elements; rows >= row_end are zero-filled. Columns [d, S) are left as they are.
template <int S>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* base, int stride, int row0,
                                          int row_end, int d, int rows = kTile) {
  const int chunks = d / 8;
  for (int i = threadIdx.x; i < rows * chunks; i += kThreads) {
    const int r = i / chunks, c = i % chunks;
    const bool valid = row0 + r < row_end;
    const __nv_bfloat16* src = base + static_cast<size_t>(valid ? row0 + r : 0) * stride + c * 8;
    cp_async16(tile + r * S + c * 8, src, valid);
  }
}

// Zeroes columns [d, W) of `rows` rows of stride S.
template <int S, int W>
__device__ __forceinline__ void zero_pad_columns(__nv_bfloat16* tiles, int rows, int d) {
  const int pad = W - d;
  if (pad <= 0) return;
  for (int i = threadIdx.x; i < rows * pad; i += kThreads) {
    const int r = i / pad, c = d + i % pad;
    tiles[r * S + c] = __float2bfloat16(0.f);
  }
}

}  // namespace zest::cuda::vmma
