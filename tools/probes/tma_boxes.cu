// TMA 2-D box throughput: every CTA (one or two per SM) loads boxes of `inner bytes × rows` from an
// L2-resident bf16 tensor into a ring of 8 stages, one thread issuing. docs/PERFORMANCE.md, v10: boxes of
// 256 rows of 32 bytes 5.0 TB/s, of 64 bytes 9.0 TB/s; 128 rows of 128 bytes 9.0 TB/s; small boxes are
// latency-bound at 8 in flight. (128 bytes × 256 rows needs 264 KB for 8 stages: "invalid argument".)
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o tma_boxes tools/probes/tma_boxes.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
struct alignas(64) Map {
  unsigned long long o[16];
};
template <int S>
__global__ void __launch_bounds__(128) tma_read(const __grid_constant__ Map map, int box_bytes, int inner_elems,
                                                int rows, int xsteps, int ysteps, int iters, unsigned long long* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(sa(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  unsigned c = blockIdx.x * 7919u;
  for (int i = 0; i < iters + S; ++i) {
    int s = i % S;
    if (i >= S) {
      unsigned phase = ((i / S) - 1) & 1;
      asm volatile(
          "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(sa(&bar[s])),
          "r"(phase));
    }
    if (i >= iters) continue;
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[s])), "r"(box_bytes));
    int x = (c % xsteps) * inner_elems, y = ((c / xsteps) % ysteps) * rows;
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            sa(smem + s * box_bytes)),
        "l"(&map), "r"(x), "r"(y), "r"(sa(&bar[s]))
        : "memory");
    c += 40503u;
  }
  if (smem[5] == 123 && smem[77] == 11) *sink = 1;
}
int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t rows_total = 8192, cols = 1024;  // bf16 elements: 16 MB tensor (L2 resident)
  void* buf;
  cudaMalloc(&buf, rows_total * cols * 2);
  cudaMemset(buf, 1, rows_total * cols * 2);
  unsigned long long* sink;
  cudaMalloc(&sink, 8);
  struct Case {
    int inner_bytes, rows, swz;
  };
  Case cases[] = {{32, 256, 32}, {64, 256, 64},  {128, 256, 128}, {32, 16, 32},
                  {64, 32, 64},  {128, 64, 128}, {128, 128, 128}, {256, 64, 128}};
  for (auto cs : cases) {
    for (int ctas : {1, 2}) {
      Map m;
      cuuint64_t dims[2] = {cols, rows_total};
      cuuint64_t strides[1] = {cols * 2};
      int inner = cs.inner_bytes / 2;
      if (cs.inner_bytes > 128) inner = 64;
      cuuint32_t box[2] = {(cuuint32_t)inner, (cuuint32_t)cs.rows};
      cuuint32_t es[2] = {1, 1};
      CUtensorMapSwizzle sw = cs.swz == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                              : cs.swz == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                             : CU_TENSOR_MAP_SWIZZLE_32B;
      CUresult r = cuTensorMapEncodeTiled((CUtensorMap*)&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf, dims, strides,
                                          box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r != CUDA_SUCCESS) {
        printf("encode failed %d\n", r);
        continue;
      }
      int box_bytes = inner * 2 * cs.rows;
      constexpr int S = 8;
      int smem = S * box_bytes + 1024;
      cudaFuncSetAttribute(tma_read<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      int iters = (int)(2e9 / ((double)sms * ctas * box_bytes));
      iters = std::max(iters, 200);
      iters = std::min(iters, 20000);
      int xsteps = cols / inner, ysteps = rows_total / cs.rows;
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      std::vector<float> ts;
      for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(a);
        tma_read<S><<<sms * ctas, 128, smem>>>(m, box_bytes, inner, cs.rows, xsteps, ysteps, iters, sink);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        ts.push_back(ms);
      }
      std::sort(ts.begin(), ts.end());
      double bytes = (double)sms * ctas * iters * box_bytes, t = ts[2] * 1e-3;
      double rows_per_cycle_sm = (double)iters * ctas * cs.rows / (t * 1.98e9);
      printf("box %4d B x %3d rows (swz %3d) ctas/SM %d: %.2f TB/s  %.1f B/cycle/SM  %.2f cycles/row/SM  err %s\n",
             inner * 2, cs.rows, cs.swz, ctas, bytes / t / 1e12, bytes / t / sms / 1.98e9, 1.0 / rows_per_cycle_sm,
             cudaGetErrorString(cudaGetLastError()));
    }
  }
}
