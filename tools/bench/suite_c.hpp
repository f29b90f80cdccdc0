// Suite C of ../shared/BENCH.md: channel-block-sparse 2-D convolution, bf16, N = 32, channels last:
// 3×3 SAME at 56×56 (C = K = 256), 28×28 (512) and 14×14 (1024); 3×3 stride 2 (56 → 28, 256); 1×1 at
// 14×14 (1024 → 256); b ∈ {32, 64}; balanced masks at d ∈ {0.5, 0.25, 0.1} and block-diagonal ones
// of 4 and 16 groups; fprop, bprop and updat. Baselines in the same process: cuDNN's dense
// convolution of the shape (its fastest algorithm for each op) and, for block-diagonal masks, its
// grouped convolution. cuDNN is loaded at run time (libcudnn.so.9, where the dynamic linker finds
// it): without it the suite reports bsjit's times alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/driver.hpp"

namespace bsjit::bench {

struct ConvRow {
  std::string shape, mask, op;
  int b = 0;
  double d = 0;
  double ms = 0, tflops = 0;  // nonzero blocks' FLOPs
  double dense_ms = 0;        // cuDNN's dense convolution of the shape (0: not measured)
  double grouped_ms = 0;      // cuDNN's grouped convolution (block-diagonal masks; 0: not measured)
  double floor_ms = 0, sol = 0;
  double error = 0;  // the op's relative error on a small image of the same layout
};

// blocks, densities: the cells to run (b, and d of the balanced masks; empty: all of suite C);
// arch: the kernels' target ("": the GPU's; "sm_90" on an H100 or H200 runs the mma.sync kernels);
// n: the images (suite C's kSuiteCImages; others check a schedule on other sizes)
inline constexpr std::int64_t kSuiteCImages = 32;
std::vector<ConvRow> run_suite_c(CUstream stream, int reps, double copy_bandwidth, const std::vector<int>& blocks = {},
                                 const std::vector<double>& densities = {}, const std::string& arch = "",
                                 std::int64_t n = kSuiteCImages);

}  // namespace bsjit::bench
