// Runs one matmul or convolution op on the GPU on fresh random inputs and compares it with the CPU
// reference. Shared by `bsjit run`, the GPU tests and the benchmark's correctness check.
#pragma once

#include <cstdint>
#include <string>

#include "bsjit/conv.hpp"
#include "bsjit/matmul.hpp"

namespace bsjit::check {

struct CheckOptions {
  std::int64_t n = 1;       // rows of X (matmul), images (conv)
  bool accumulate = false;  // output starts as random values and the op adds to it
  bool gated = false;       // random per-block gates, about one in four exactly 0
  std::uint64_t seed = 1;
  void* workspace = nullptr;  // OpOptions::workspace (null: bsjit's own)
  std::size_t workspace_bytes = 0;
};

struct CheckResult {
  double relative_error = 0.0;  // normwise, against the double-precision reference
  std::int64_t outputs = 0;
  std::int64_t unwritten = 0;   // outputs still holding the NaN poison
};

// Needs a GPU; runs in the current context on the default stream and synchronizes.
CheckResult run_and_check(const MatMul& mm, Op op, const CheckOptions& options);

enum class ConvOp { fprop, bprop, updat };
const char* to_string(ConvOp op);

// The same for a convolution's op (a deconvolution's too), with random per-block gates where
// options.gated; no workspace.
CheckResult run_and_check(const Conv& conv, ConvOp op, const CheckOptions& options);

// Tolerance of the standards: fp32 1e-5, fp16/bf16 inputs with fp32 accumulation 1e-2.
double tolerance(DType dtype);
double tolerance(const MatMulOptions& options);  // TF32: the 16-bit tolerance (10 mantissa bits)

}  // namespace bsjit::check
