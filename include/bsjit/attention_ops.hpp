// Block-sparse attention, decomposed: the ops of openai/blocksparse's BlocksparseTransformer, each a
// kernel generated for the masks, for models that need the score matrix itself (custom element
// masks, inspection of the probabilities) or their own fusion. bsjit::Attention is the fast path.
//
// A block-sparse tensor holds [batch, heads, blocks of the head's mask, block, block] values: the
// head's nonzero blocks in its mask's row-major order (Layout's block order), each block row-major
// (query, key); sparse_elements(heads) gives one batch's count. Forward and backward of attention:
//   S = scores(Q, K)            P = softmax(S)              O = probs_v(P, V)
//   dP = scores(dO, V)          dS = softmax_grad(P, dP)    dV = probs_t(P, dO)
//   dQ = probs_v(dS, K)         dK = probs_t(dS, Q)
// (blocksparse's nt, masked softmax, nn and tn ops.) Dense tensors are shaped like Q ([batch,
// seq_q, heads, head_dim] or [batch, heads, seq_q, head_dim], AttentionOptions::order) or like K
// (seq_k positions). Every op is asynchronous on its stream; pointers are device pointers,
// 16-byte aligned; inputs and outputs in AttentionOptions::dtype, fp32 inside.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bsjit/attention.hpp"
#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"

namespace bsjit {

// Element masks inside the nonzero blocks, applied by softmax (with causal and key padding). At
// most one of:
// - callback(mask, query_block, key_block, keep): called once per nonzero block of every mask (mask:
//   its index in the masks given, 0 for a shared one); fills keep[block · block] row-major (query,
//   key), 0 masking the pair. Called in the constructor.
// - bits: one bit per pair of every nonzero block of every mask, the masks one after the other and
//   each in its row-major block order: pair (r, c) of block i (counted over all masks) is bit
//   n = i · block² + r · block + c, bit n % 32 of bits[n / 32]; 1 keeps the pair.
struct ElementMasks {
  std::function<void(std::int64_t mask, std::int64_t query_block, std::int64_t key_block, std::uint8_t* keep)> callback;
  std::vector<std::uint32_t> bits;
};

class AttentionOps {
 public:
  // masks and options as bsjit::Attention's (options.causal masks inside diagonal blocks in softmax).
  AttentionOps(std::vector<Layout> masks, AttentionOptions options, ElementMasks element_masks = {});
  ~AttentionOps();
  AttentionOps(AttentionOps&&) noexcept;
  AttentionOps& operator=(AttentionOps&&) noexcept;

  // s = a · bᵀ on every nonzero block, unscaled (nt): a shaped like Q, b like K.
  void scores(const void* a, const void* b, void* s, std::int64_t batch, std::int64_t heads,
              Stream stream = nullptr) const;
  // p = softmax(scale · s) over each query row's blocks; entries masked (causal, key_padding —
  // [batch, seq_k] bytes on the device, 0 for a padded key —, element masks) and rows with no key
  // left are 0. scale 0: 1 / sqrt(head_dim).
  void softmax(const void* s, void* p, std::int64_t batch, std::int64_t heads, Stream stream = nullptr, float scale = 0,
               const std::uint8_t* key_padding = nullptr) const;
  // ds = scale · p ∘ (dp − rowsum(dp ∘ p)), the gradient of softmax's input.
  void softmax_grad(const void* p, const void* dp, void* ds, std::int64_t batch, std::int64_t heads,
                    Stream stream = nullptr, float scale = 0) const;
  // out = p · v (nn): v shaped like K, out like Q.
  void probs_v(const void* p, const void* v, void* out, std::int64_t batch, std::int64_t heads,
               Stream stream = nullptr) const;
  // out = pᵀ · x (tn): x shaped like Q, out like K.
  void probs_t(const void* p, const void* x, void* out, std::int64_t batch, std::int64_t heads,
               Stream stream = nullptr) const;

  // Elements of one batch of a block-sparse tensor for `heads` heads.
  std::int64_t sparse_elements(std::int64_t heads) const;
  // Compiles the five kernels for arch into the cache (no GPU needed); how many were compiled now.
  int precompile(const std::string& arch) const;

  // Loads the five kernels into the current context, as Attention::load.
  void load(bool strict = false) const;

  std::int64_t seq_q() const;
  std::int64_t seq_k() const;
  const AttentionOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bsjit
