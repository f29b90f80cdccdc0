// Block-sparse attention: softmax(scale · Q·Kᵀ + masks) · V over the key blocks a block mask gives
// each query block, fused (flash-style: online softmax, no score matrix in memory), with the
// log-sum-exp of every query row for the backward. One kernel per (masks, options), generated and
// cached like the matmul kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"

namespace bsjit {

struct AttentionOptions {
  int block = 64;      // of the block mask: 16, 32, 64 or 128 positions
  int head_dim = 64;   // 32, 64 or 128
  DType dtype = DType::bf16;  // f16 or bf16; fp32 accumulation and softmax
  QkvOrder order = QkvOrder::bshd;
  bool causal = false;  // keys after the query are masked (inside the diagonal blocks)
  std::string arch;     // as MatMulOptions::arch
  // Query heads per key/value head (grouped-query attention): K and V (and dK, dV) have
  // heads / kv_group heads, query head h attending key/value head h / kv_group. 1: multi-head
  // attention; kv_group = heads: multi-query. Calls' heads must be a multiple of it.
  int kv_group = 1;
};

class Attention {
 public:
  // masks: [seq_q / block, seq_k / block] block masks (bsjit::layouts builds the common ones), one
  // shared by every head or one per head (then `heads` in calls must match).
  Attention(std::vector<Layout> masks, AttentionOptions options);
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // out = attention(q, k, v), shaped like q (k and v with heads / kv_group heads); lse: [batch, heads, seq_q] fp32, the
  // natural-log log-sum-exp of each row's scaled scores (-inf for a row with no key, whose output is 0). key_padding:
  // null, or [batch, seq_k] bytes on the device, 0 marking a padded key. scale 0: 1 / sqrt(head_dim). Device pointers,
  // 16-byte aligned; asynchronous on stream.
  void forward(const void* q, const void* k, const void* v, void* out, float* lse, std::int64_t batch,
               std::int64_t heads, Stream stream = nullptr, float scale = 0,
               const std::uint8_t* key_padding = nullptr) const;

  // dq, dk, dv (shaped like q, k, v; dk and dv summed over each key/value head's query heads) from the forward's
  // inputs, its out and lse, and dout; the same batch, heads, scale and key_padding as the forward. Uses a workspace of
  // backward_workspace_size(batch, heads) bytes: the caller's (16-byte aligned, one call at a time
  // on it; for allocators and CUDA graph capture, where bsjit must not allocate), else one per
  // context kept between calls (then calls on one Attention must not overlap on different streams).
  void backward(const void* q, const void* k, const void* v, const void* out, const float* lse, const void* dout,
                void* dq, void* dk, void* dv, std::int64_t batch, std::int64_t heads, Stream stream = nullptr,
                float scale = 0, const std::uint8_t* key_padding = nullptr, void* workspace = nullptr,
                std::size_t workspace_bytes = 0) const;
  // batch · heads · seq_q · (head_dim + 1) floats: the dQ accumulator and each row's Delta; with
  // kv_group > 1 also 2 · batch · heads / kv_group · seq_k · head_dim: the dK and dV accumulators.
  std::size_t backward_workspace_size(std::int64_t batch, std::int64_t heads) const;

  // Compiles the forward's and the backward's kernels for arch into the cache (no GPU needed); true
  // when any was compiled now.
  bool precompile(const std::string& arch) const;

  // Loads the forward's and the backward's kernels into the current context (device 0's primary
  // one when there is none), from the cache or compiled on a miss (strict: a miss is an error), so
  // that the first calls pay nothing.
  void load(bool strict = false) const;

  std::int64_t seq_q() const;
  std::int64_t seq_k() const;
  const AttentionOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bsjit
