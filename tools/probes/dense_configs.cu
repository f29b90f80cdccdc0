// cuBLASLt's dense bf16 GEMM Y[N,K] = X[N,C] · W[C,K] (row-major, fp32 accumulation) on every
// config its heuristic offers, and on each again with the thread-block cluster forced to 1 × 1:
// how fast a dense kernel does a suite W cell's work (the cell's dense equivalent, bsjit-bench)
// when its CTAs share no operand tile through cluster multicast and when its output tile is no
// wider than a sparse block column, the two things a random block layout denies a sparse kernel.
// (With CUDA 13.0's nvjet kernels, algo 66, the cluster attribute reads -1 and cannot be set, so
// the 1 × 1 lines stay empty; the tile attribute reads as cuBLAS's M × N: features × rows of Y.)
// Timed as bsjit-bench times: each run after a 256 MiB read (L2 holds none of the operands),
// CUDA events, median of 20. Prints one line per config: tile, stages, cluster, split-K, ms,
// TFLOP/s; then the best overall, with a 1 × 1 cluster, and with a 1 × 1 cluster and tiles at most
// 32, 64 and 128 features wide. docs/PERFORMANCE.md, measurements of 2026-12-03.
//   nvcc -std=c++17 -O2 -o dense_configs tools/probes/dense_configs.cu -lcublasLt
//   ./dense_configs N C K
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    auto e_ = (x);                                                                 \
    if (static_cast<int>(e_) != 0) {                                               \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #x, static_cast<int>(e_), __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

__global__ void read_all(const float4* p, size_t n, float* sink) {  // the L2 flush: reads, one tiny write
  float4 acc{0, 0, 0, 0};
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float4 v = p[i];
    acc.x += v.x, acc.y += v.y;
  }
  if (acc.x == 12345.f) *sink = acc.y;
}

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f));
  }
}

// CUBLASLT_MATMUL_TILE_* as rows × columns of cuBLAS's column-major output (Yᵀ: K features × N rows)
static const char* tile_name(int id, int* features) {
  struct T {
    int id;
    const char* name;
    int rows;
  };
  static const T tiles[] = {
      {CUBLASLT_MATMUL_TILE_64x64, "64x64", 64},       {CUBLASLT_MATMUL_TILE_64x128, "64x128", 64},
      {CUBLASLT_MATMUL_TILE_128x64, "128x64", 128},    {CUBLASLT_MATMUL_TILE_128x128, "128x128", 128},
      {CUBLASLT_MATMUL_TILE_128x256, "128x256", 128},  {CUBLASLT_MATMUL_TILE_256x64, "256x64", 256},
      {CUBLASLT_MATMUL_TILE_256x128, "256x128", 256},  {CUBLASLT_MATMUL_TILE_64x256, "64x256", 64},
      {CUBLASLT_MATMUL_TILE_64x32, "64x32", 64},       {CUBLASLT_MATMUL_TILE_32x64, "32x64", 32},
      {CUBLASLT_MATMUL_TILE_128x32, "128x32", 128},    {CUBLASLT_MATMUL_TILE_32x128, "32x128", 32},
      {CUBLASLT_MATMUL_TILE_256x32, "256x32", 256},    {CUBLASLT_MATMUL_TILE_128x96, "128x96", 128},
      {CUBLASLT_MATMUL_TILE_128x192, "128x192", 128},  {CUBLASLT_MATMUL_TILE_64x192, "64x192", 64},
      {CUBLASLT_MATMUL_TILE_192x128, "192x128", 192},  {CUBLASLT_MATMUL_TILE_256x192, "256x192", 256},
      {CUBLASLT_MATMUL_TILE_192x256, "192x256", 192},  {CUBLASLT_MATMUL_TILE_128x160, "128x160", 128},
  };
  for (const T& t : tiles)
    if (t.id == id) return *features = t.rows, t.name;
  *features = -1;
  return id == CUBLASLT_MATMUL_TILE_UNDEFINED ? "undefined" : "other";
}

int main(int argc, char** argv) {
  if (argc < 4) return std::fprintf(stderr, "usage: dense_configs N C K\n"), 2;
  const long long N = std::atoll(argv[1]), C = std::atoll(argv[2]), K = std::atoll(argv[3]);
  __nv_bfloat16 *x, *w, *y;
  CHECK(cudaMalloc(&x, N * C * 2));
  CHECK(cudaMalloc(&w, C * K * 2));
  CHECK(cudaMalloc(&y, N * K * 2));
  fill<<<1024, 256>>>(x, N * C, 1);
  fill<<<1024, 256>>>(w, C * K, 2);
  const size_t flush_bytes = size_t(256) << 20;
  float4* flush;
  float* sink;
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(flush, 0, flush_bytes));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws;
  CHECK(cudaMalloc(&ws, ws_bytes));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t desc;
  CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // row-major Y = X·W is column-major Yᵀ[K,N] = Wᵀ[K,C] · Xᵀ[C,N]
  cublasLtMatrixLayout_t la, lb, lc;
  CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, C, K));
  CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, C, N, C));
  CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, K, N, K));
  cublasLtMatmulPreference_t pref;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                             sizeof(ws_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> found(64);
  int count = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, static_cast<int>(found.size()), found.data(),
                                       &count));
  const float alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto time = [&](const cublasLtMatmulAlgo_t& algo) {
    std::vector<float> ms;
    for (int r = 0; r < 23; ++r) {
      read_all<<<528, 512, 0, s>>>(flush, flush_bytes / 16, sink);
      CHECK(cudaEventRecord(e0, s));
      if (cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &algo, ws, ws_bytes, s) !=
          CUBLAS_STATUS_SUCCESS)
        return -1.0;
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float t;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  auto config = [](const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    int v = -1;  // every attribute read here is a 32-bit value
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
    return v;
  };
  const double flop = 2.0 * N * C * K;
  const int widths[] = {32, 64, 128};
  double best = 1e30, best_1x1 = 1e30, best_narrow[3] = {1e30, 1e30, 1e30};
  std::printf("N=%lld C=%lld K=%lld: %d configs from the heuristic\n", N, C, K, count);
  std::printf("%-4s %-6s %-10s %-6s %-8s %-6s %10s %8s\n", "#", "algo", "tile", "stages", "cluster", "splitK", "ms",
              "TFLOP/s");
  for (int i = 0; i < count; ++i)
    for (int forced = 0; forced < 2; ++forced) {
      cublasLtMatmulAlgo_t algo = found[i].algo;
      if (forced) {
        const int one = CUBLASLT_CLUSTER_SHAPE_1x1x1;
        if (config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) == one) continue;
        if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &one, sizeof(one)) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        cublasLtMatmulHeuristicResult_t checked;
        if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &algo, &checked) != CUBLAS_STATUS_SUCCESS) {
          std::printf("%-4d (cluster 1x1 refused)\n", i);
          continue;
        }
      }
      int features = 0;
      const char* tile = tile_name(config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID), &features);
      const int cluster = config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
      const double ms = time(algo);
      if (ms <= 0) {
        std::printf("%-4d failed to run\n", i);
        continue;
      }
      std::printf("%-4d %-6d %-10s %-6d %-8d %-6d %10.4f %8.1f%s\n", i, config(algo, CUBLASLT_ALGO_CONFIG_ID), tile,
                  config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), cluster, config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                  ms, flop / ms / 1e9, forced ? "  (cluster forced 1x1)" : "");
      best = std::min(best, ms);
      if (cluster == CUBLASLT_CLUSTER_SHAPE_1x1x1) best_1x1 = std::min(best_1x1, ms);
      for (int j = 0; j < 3; ++j)
        if (features > 0 && features <= widths[j] && cluster == CUBLASLT_CLUSTER_SHAPE_1x1x1)
          best_narrow[j] = std::min(best_narrow[j], ms);
    }
  auto line = [&](const char* what, double ms) {
    if (ms < 1e30) std::printf("best %-40s %8.4f ms %7.1f TFLOP/s\n", what, ms, flop / ms / 1e9);
    else std::printf("best %-40s none\n", what);
  };
  line("overall", best);
  line("with a 1x1 cluster", best_1x1);
  for (int j = 0; j < 3; ++j) {
    const std::string narrow = "with a 1x1 cluster, tile <= " + std::to_string(widths[j]) + " features";
    line(narrow.c_str(), best_narrow[j]);
  }
  return 0;
}
