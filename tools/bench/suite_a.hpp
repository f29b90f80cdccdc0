// Suite A of ../shared/BENCH.md: block-sparse attention, fused forward and backward. B = 4, H = 16, S = 8192,
// bf16, head dim 128 and 64, masks at block 128 and 64: causal, and causal sliding window of 1024
// keys plus the first 256 keys global (block-aligned: 8 window blocks at 128). Dense SDPA and
// FlexAttention are measured by torch in the same device call (tools/bench/torch_attention.py).
// Also the forward through the decomposed ops (AttentionOps: scores, softmax, probs_v), which
// writes and reads the block-sparse score and probability tensors. One grouped-query case: causal
// with 16 query heads over 2 key/value heads.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/driver.hpp"

namespace bsjit::bench {

struct AttentionRow {
  std::string mask;
  int block = 0, head_dim = 0;
  double ms = 0, tflops = 0, error = 0;  // FLOPs of attended (query, key) pairs only: 4 · pairs · D
  double backward_ms = 0;                 // dQ, dK, dV (10 · pairs · D FLOPs: 5 products)
  double backward_error = 0;              // of dQ, dK, dV and lse on the sampled rows
  double decomposed_ms = 0;               // scores + softmax + probs_v
};

std::vector<AttentionRow> run_suite_a(CUstream stream, int reps);

}  // namespace bsjit::bench
