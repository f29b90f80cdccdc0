// L2 -> shared memory bandwidth: every SM's CTAs copy chunks of a buffer with cp.async.bulk into a ring
// of stages (and, for comparison, 16-byte ld.global.cg by 8 CTAs per SM), for buffers that fit L2 and one
// that does not. docs/PERFORMANCE.md, v10: 9.0 TB/s from L2 with 16 KB chunks.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o l2_bulk_read tools/probes/l2_bulk_read.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int CHUNK, int S>
__global__ void __launch_bounds__(128) bulk_read(const char* buf, size_t bytes, int iters, unsigned long long* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(sa(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  size_t nchunks = bytes / CHUNK;
  size_t c = (size_t)blockIdx.x * 7919 % nchunks;
  int total = iters;
  for (int i = 0; i < total; ++i) {
    int s = i % S;
    if (i >= S) {
      unsigned phase = ((i / S) - 1) & 1;
      asm volatile(
          "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(sa(&bar[s])),
          "r"(phase));
    }
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[s])), "r"(CHUNK));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     sa(smem + s * CHUNK)),
                 "l"(buf + c * CHUNK), "r"(CHUNK), "r"(sa(&bar[s]))
                 : "memory");
    c += gridDim.x;
    if (c >= nchunks) c -= nchunks;
  }
  for (int i = total; i < total + S; ++i) {
    int s = i % S;
    unsigned phase = ((i / S) - 1) & 1;
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(sa(&bar[s])),
                 "r"(phase));
  }
  if (smem[5] == 123 && smem[77] == 11) *sink = 1;
}
__global__ void ld_read(const int4* buf, size_t n4, int iters, unsigned long long* sink) {
  size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) % n4;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  int4 acc = {0, 0, 0, 0};
  for (int k = 0; k < iters; ++k) {
    int4 v = __ldcg(buf + i);
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
    i += stride;
    if (i >= n4) i -= n4;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345) *sink = 1;
}
template <int CHUNK, int S>
void run_bulk(const char* buf, size_t bytes, int ctas_per_sm, unsigned long long* sink, int sms) {
  auto k = bulk_read<CHUNK, S>;
  int sm = CHUNK * S;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
  int grid = sms * ctas_per_sm, iters = 2000;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(a);
    k<<<grid, 128, sm>>>(buf, bytes, iters, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  double gb = (double)grid * iters * CHUNK / 1e9;
  printf("bulk chunk %6d stages %d ctas/SM %d buffer %8.1f MB: %.3f ms  %.2f TB/s  (err %s)\n", CHUNK, S, ctas_per_sm,
         bytes / 1e6, ts[3], gb / ts[3], cudaGetErrorString(cudaGetLastError()));
}
int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  size_t big = 4ull << 30;
  char* buf;
  cudaMalloc(&buf, big);
  cudaMemset(buf, 1, big);
  unsigned long long* sink;
  cudaMalloc(&sink, 8);
  for (size_t bytes : {size_t(8) << 20, size_t(24) << 20, size_t(40) << 20, big}) {
    run_bulk<16384, 8>(buf, bytes, 1, sink, sms);
    run_bulk<16384, 12>(buf, bytes, 1, sink, sms);
    run_bulk<4096, 16>(buf, bytes, 1, sink, sms);
    run_bulk<8192, 8>(buf, bytes, 2, sink, sms);
    run_bulk<2048, 16>(buf, bytes, 2, sink, sms);
    // ld.global
    size_t n4 = bytes / 16;
    int grid = sms * 8, iters = 400;
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> ts;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(a);
      ld_read<<<grid, 256>>>((const int4*)buf, n4, iters, sink);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    printf("ld.global.cg v4 buffer %8.1f MB: %.3f ms %.2f TB/s\n", bytes / 1e6, ts[3],
           (double)grid * 256 * iters * 16 / 1e9 / ts[3]);
  }
}
