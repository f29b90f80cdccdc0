// One pass over a buffer the size of the small-batch case's W (N = 64, C = K = 16384, d = 0.1:
// 53.7 MB, L2 flushed before each run), read by cp.async.bulk into a ring of stages: what a kernel
// that only streams W can reach, by chunk size, stages, CTAs per SM and grid; optionally with a
// second, L2-resident read per chunk (the X slice of the matmul); and the same for writes (dW).
// docs/PERFORMANCE.md, small batch.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o stream_once tools/probes/stream_once.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wait_parity(unsigned bar, unsigned phase) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(bar),
               "r"(phase));
}
__device__ __forceinline__ void bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// CTA i reads chunks i, i + grid, ... (chunk = CHUNK bytes), and with XCHUNK > 0 also XCHUNK bytes
// of a 2 MB buffer per chunk.
template <int CHUNK, int XCHUNK, int S>
__global__ void __launch_bounds__(128)
    stream(const char* w, size_t nchunks, const char* x, int order, unsigned long long* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(sa(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  int i = 0;
  for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x, ++i) {
    const int s = i % S;
    if (i >= S) wait_parity(sa(&bar[s]), ((i / S) - 1) & 1);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[s])), "r"(CHUNK + XCHUNK));
    unsigned char* st = smem + s * (CHUNK + XCHUNK);
    bulk(sa(st), w + (order ? c * 7919 % nchunks : c) * CHUNK, CHUNK, sa(&bar[s]));
    if (XCHUNK)
      bulk(sa(st + CHUNK), x + (c * 7919 % ((2u << 20) / (XCHUNK ? XCHUNK : 1))) * XCHUNK, XCHUNK, sa(&bar[s]));
  }
  for (int j = i > S ? i - S : 0; j < i; ++j) wait_parity(sa(&bar[j % S]), (j / S) & 1);
  if (smem[5] == 123 && smem[77] == 11) *sink = 1;
}
// The writing side (backward-weight's small batch writes dW's 53.7 MB): CTA i writes chunks i,
// i + grid, ... of w from shared memory by cp.async.bulk stores, one bulk group per chunk. With
// XCHUNK > 0 each chunk is first read as XCHUNK bytes of the 2 MB buffer x (what the kernel reads of
// X and dY from L2 per block), S - 1 chunks ahead; the chunk written is the first CHUNK bytes of
// that stage. Without, every chunk is written from the same shared memory, at most S in flight.
template <int CHUNK, int XCHUNK, int S>
__global__ void __launch_bounds__(128) stream_write(char* w, size_t nchunks, const char* x) {
  constexpr int kStage = CHUNK > XCHUNK ? CHUNK : XCHUNK;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned long long bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(sa(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  const size_t mine = nchunks > blockIdx.x ? (nchunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto read = [&](size_t i) {  // chunk i of this CTA's into stage i % S
    const size_t c = blockIdx.x + i * gridDim.x;
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[i % S])), "r"(XCHUNK));
    bulk(sa(smem + (i % S) * kStage), x + (c * 7919 % ((2u << 20) / (XCHUNK ? XCHUNK : 1))) * XCHUNK, XCHUNK,
         sa(&bar[i % S]));
  };
  if (XCHUNK)
    for (size_t i = 0; i + 1 < S && i < mine; ++i) read(i);
  for (size_t i = 0; i < mine; ++i) {
    const unsigned char* src = smem;
    if (XCHUNK) {
      wait_parity(sa(&bar[i % S]), (i / S) & 1);
      src = smem + (i % S) * kStage;
    }
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                     w + (blockIdx.x + i * gridDim.x) * CHUNK),
                 "r"(sa(src)), "r"(CHUNK)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (XCHUNK) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");  // chunk i - 1's stage is free
      if (i + S - 1 < mine) read(i + S - 1);
    } else {
      asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(S) : "memory");
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Reads the scratch buffer: L2 ends up holding its clean lines (a memset leaves dirty ones, which
// the timed kernel's reads must write back first).
__global__ void read_all(const int4* buf, size_t n4, unsigned long long* sink) {
  int4 acc = {0, 0, 0, 0};
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
    int4 v = __ldcg(buf + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345) *sink = 1;
}
bool write_flush = true;
int order = 0;  // 0: chunk c at c; 1: at c · 7919 mod chunks (scattered, as a column of a row-major block order)
__global__ void empty(unsigned long long* sink) {
  if (threadIdx.x == 1000) *sink = 1;
}
char *w, *x, *scratch;
unsigned long long* sink;
template <class F>
float time_once(F launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 15; ++r) {
    // flush L2, keep the GPU busy while the launch is queued
    if (write_flush)
      cudaMemsetAsync(scratch, r, 256 << 20);
    else
      read_all<<<132 * 8, 256>>>((const int4*)scratch, (256 << 20) / 16, sink);
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
const size_t kBytes = size_t(16384) * 16384 * 2 / 10;
template <int CHUNK, int XCHUNK, int S>
void run(int grid, const char* what) {
  auto k = stream<CHUNK, XCHUNK, S>;
  int sm = (CHUNK + XCHUNK) * S;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
  size_t n = kBytes / CHUNK;
  float ms = time_once([&] { k<<<grid, 128, sm>>>(w, n, x, order, sink); });
  printf("%-21s %-22s chunk %6d x %5d stages %2d grid %4d: %.4f ms  %.2f TB/s on W  (%s)\n",
         write_flush ? "memset-flush"
         : order     ? "read-flush, scattered"
                     : "read-flush",
         what, CHUNK, XCHUNK, S, grid, ms, n * CHUNK / 1e9 / ms, cudaGetErrorString(cudaGetLastError()));
}
template <int CHUNK, int XCHUNK, int S>
void run_write(int grid, const char* what) {
  auto k = stream_write<CHUNK, XCHUNK, S>;
  int sm = (CHUNK > XCHUNK ? CHUNK : XCHUNK) * S;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
  size_t n = kBytes / CHUNK;
  float ms = time_once([&] { k<<<grid, 128, sm>>>(w, n, x); });
  printf("%-21s %-22s write %6d x %5d stages %2d grid %4d: %.4f ms  %.2f TB/s on W  (%s)\n",
         write_flush ? "memset-flush" : "read-flush", what, CHUNK, XCHUNK, S, grid, ms, n * CHUNK / 1e9 / ms,
         cudaGetErrorString(cudaGetLastError()));
}
int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaMalloc(&w, kBytes + (1 << 20));
  cudaMalloc(&x, 2 << 20);
  cudaMalloc(&scratch, 256 << 20);
  cudaMalloc(&sink, 8);
  cudaMemset(w, 1, kBytes);
  cudaMemset(x, 1, 2 << 20);
  for (int mode = 0; mode < 3; ++mode) {
    write_flush = mode == 0;
    order = mode == 2;
    for (int grid : {132, 256})
      printf("empty kernel grid %d: %.4f ms\n", grid, time_once([&] { empty<<<grid, 128>>>(sink); }));
    printf("memset 53.7 MB: %.4f ms\n", time_once([&] { cudaMemsetAsync(w, 2, kBytes); }));
    run<8192, 8192, 6>(256, "as small b64 kernel");
    run<8192, 0, 6>(256, "W only");
    run<8192, 0, 12>(132, "W only");
    run<8192, 0, 6>(264, "W only");
    run<8192, 0, 8>(264, "W only");
    run<16384, 0, 6>(132, "W only");
    run<16384, 0, 12>(132, "W only");
    run<32768, 0, 6>(132, "W only");
    run<8192, 0, 16>(132, "W only");
    run<2048, 4096, 12>(264, "as small b32");
    run<2048, 0, 24>(264, "W only b32 blocks");
    run<8192, 8192, 6>(264, "W + X");
    run<8192, 8192, 12>(132, "W + X");
    run<8192, 4096, 8>(264, "W + half X");
    if (mode == 2) continue;
    // backward-weight's small batch: dW written, X and dY read from L2 (16 KB per 8 KB block at b = 64)
    run_write<8192, 0, 4>(132, "dW only");
    run_write<8192, 0, 8>(264, "dW only");
    run_write<32768, 0, 4>(132, "dW only");
    run_write<8192, 16384, 4>(396, "as small b64 dW");
    run_write<8192, 16384, 6>(264, "as small b64 dW");
    run_write<2048, 8192, 8>(264, "as small b32 dW");
  }
}
