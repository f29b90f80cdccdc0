// What bsjit is measured against, in the same process: cuBLAS dense GEMM, cuSPARSE Blocked-ELL
// SpMM, and a device-to-device copy. Only this tool links cuBLAS and cuSPARSE, never the library.
#pragma once

#include <cstdint>
#include <functional>

#include "bsjit/layout.hpp"
#include "runtime/driver.hpp"

namespace bsjit::bench {

// Median time in ms of fn over reps runs after warmup runs, each timed with CUDA events on stream.
double time_ms(const std::function<void()>& fn, CUstream stream, int warmup, int reps);

// Copy bandwidth in bytes/s (bytes read + written) of a large device-to-device copy.
double copy_bandwidth(CUstream stream, int reps);

// Dense bf16 GEMM Y[N,K] = X[N,C] · W[C,K] (row-major), fp32 compute. ms.
double cublas_dense_ms(std::int64_t n, std::int64_t c, std::int64_t k, CUstream stream, int reps);

// cuSPARSE Blocked-ELL SpMM Yᵀ = Wᵀ · Xᵀ for the layout at block b (bf16, fp16 where bf16 is
// refused). ms; negative when cuSPARSE rejects the case. x and y are device arrays [n, C], [n, K].
double cusparse_bell_ms(const Layout& layout, int block, std::int64_t n, const void* x, void* y, CUstream stream,
                        int reps);

}  // namespace bsjit::bench
