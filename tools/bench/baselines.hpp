// What bsjit is measured against, in the same process: cuBLAS dense GEMM, cuSPARSE Blocked-ELL
// SpMM, and a device-to-device copy. Only this tool links cuBLAS and cuSPARSE, never the library.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "bsjit/layout.hpp"
#include "runtime/driver.hpp"

namespace bsjit::bench {

// Median time in ms of fn over reps runs after warmup runs, each timed with CUDA events on stream.
// By default each timed run follows a read of a 256 MiB scratch buffer on the same stream: the
// GPU is busy while the host enqueues fn (so a short kernel is not charged the host's launch time,
// as it was before 2026-11-30: the GPU idled from the first event until the launch arrived), and
// L2 holds none of fn's inputs (as in a model whose other layers ran in between).
double time_ms(const std::function<void()>& fn, CUstream stream, int warmup, int reps);

// Off: time each run from an idle GPU, the first event just before fn (the method of the figures
// before 2026-11-30), for comparison.
void set_flush_before_timing(bool on);

// Random bf16 bits in [-1, 1), quickly (hundreds of millions of values).
std::vector<std::uint16_t> random_bf16_bits(std::size_t n, std::uint64_t seed);

// Copy bandwidth in bytes/s (bytes read + written) of a large device-to-device copy.
double copy_bandwidth(CUstream stream, int reps);

// What cuBLAS's dense GEMM multiplies: bf16 (fp32 accumulation), fp32 exact, fp32 through TF32.
enum class Dense { bf16, f32, tf32 };

// Dense GEMM Y[N,K] = X[N,C] · W[C,K] (row-major), fp32 accumulation. ms.
double cublas_dense_ms(std::int64_t n, std::int64_t c, std::int64_t k, Dense kind, CUstream stream, int reps);

// Y[N,K] = X[N,C] · W[C,K] (row-major fp32 on the device) by cuBLAS, exact or through TF32: for
// checking cuBLAS's own accuracy.
void cublas_gemm_f32(const float* x, const float* w, float* y, std::int64_t n, std::int64_t c, std::int64_t k,
                     bool tf32, CUstream stream);

// cuSPARSE Blocked-ELL SpMM Yᵀ = Wᵀ · Xᵀ for the layout at block b (bf16, fp16 where bf16 is
// refused). ms; negative when cuSPARSE rejects the case. x and y are device arrays [n, C], [n, K].
double cusparse_bell_ms(const Layout& layout, int block, std::int64_t n, const void* x, void* y, CUstream stream,
                        int reps);

}  // namespace bsjit::bench
