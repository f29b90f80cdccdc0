// wgmma m64n256k16 throughput with A (64 × 16) from shared memory in each layout the grouped kernel
// may use (K- or M-major; 32-, 64- or 128-byte swizzle) or from registers, B a 128-byte-swizzled K-major
// tile of 256 rows; one or two consumer warpgroups per SM, clock64 per wgmma. docs/PERFORMANCE.md, v10:
// 128 cycles each (256 with two warpgroups sharing the tensor cores) in every layout.
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I templates -o wgmma_a_layouts
//   tools/probes/wgmma_a_layouts.cu
#include <cuda_runtime.h>

#include <cstdio>

#include "bsjit/wgmma.cuh"
using namespace bsjit::kernels;
template <int SWZ, int TRANS_A, int REGS>
__global__ void __launch_bounds__(256, 1) probe(int iters, unsigned long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* base = swizzle_aligned(smem);
  for (int i = threadIdx.x; i < 48 * 1024 / 4; i += blockDim.x) reinterpret_cast<unsigned*>(base)[i] = 0x3c003c00u;
  __syncthreads();
  fence_proxy_async();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  unsigned char* a = base + 32768 + wg * 4096;  // A: 64 x 16 (2 KB) per consumer
  unsigned char* bt = base;                     // B: 256 rows x 128 B (K-major SW128)
  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  unsigned ar[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  constexpr int RB = SWZ;  // row bytes of A's layout
  unsigned long long da = TRANS_A ? smem_descriptor_swizzled<SWZ>(a, (SWZ / 2) * SWZ, 8 * RB)
                                  : smem_descriptor_swizzled<SWZ>(a, 16, 8 * RB);
  unsigned long long db = smem_descriptor(bt, 16, 1024);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (REGS) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
            "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
            "%29,%30,%31,"
            "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%"
            "58,%59,%60,%61,%62,%63,"
            "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%"
            "90,%91,%92,%93,%94,%95,"
            "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,"
            "%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
            "{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
              "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
              "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
              "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),
              "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
              "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "l"(db + 2 * k));
      } else {
        wgmma_m64k16<bfloat16_t, 256, TRANS_A, 0>(d, da, db + 2 * k);
      }
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  long long t1 = clock64();
  wgmma_fence_registers(d);
  float s = 0;
  for (int i = 0; i < 128; ++i) s += d[i];
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  if (s == 12345.f) *sink = s;
}
template <int SWZ, int TRANS_A, int REGS>
void run(const char* name, int consumers) {
  unsigned long long* c;
  float* sink;
  cudaMalloc(&c, 264 * 8 * 2);
  cudaMalloc(&sink, 4);
  auto k = probe<SWZ, TRANS_A, REGS>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 50 * 1024);
  int iters = 2000;
  k<<<132, 128 * consumers, 50 * 1024>>>(iters, c, sink);
  cudaDeviceSynchronize();
  unsigned long long h[2];
  cudaMemcpy(h, c, 16, cudaMemcpyDeviceToHost);
  double per = (double)h[0] / (iters * 4);
  printf("%-28s consumers %d: %.1f cycles per m64n256k16 (ideal 128 per consumer alone, %d with both)  %s\n", name,
         consumers, per, 128 * consumers, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  for (int c : {1, 2}) {
    run<128, 0, 0>("A smem K-major SW128", c);
    run<64, 0, 0>("A smem K-major SW64", c);
    run<32, 0, 0>("A smem K-major SW32", c);
    run<128, 1, 0>("A smem MN-major SW128", c);
    run<64, 1, 0>("A smem MN-major SW64", c);
    run<32, 1, 0>("A smem MN-major SW32", c);
    run<128, 0, 1>("A registers", c);
  }
}
