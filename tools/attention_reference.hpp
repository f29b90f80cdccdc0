// CPU reference for block-sparse attention (for the attention ops' GPU tests): dense
// attention in double precision over the keys each query may attend: the block mask expanded,
// then causal, key-padding and element masks applied. The fused forward (output and log-sum-exp),
// its backward (dQ, dK, dV), and the decomposed ops of blocksparse's BlocksparseTransformer over
// the nonzero blocks (nt: scores; softmax; nn: probabilities · V; tn: probabilitiesᵀ · dO; the
// softmax gradient).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"

namespace bsjit::reference {

struct AttentionProblem {
  std::int64_t batch = 1, heads = 1, seq_q = 0, seq_k = 0, head_dim = 0;
  int block = 0;
  // Query heads per key/value head (grouped-query attention): K, V (and dK, dV) have heads /
  // kv_group heads, query head h reading head h / kv_group.
  std::int64_t kv_group = 1;
  // [seq_q / block, seq_k / block] block masks: one per head, or one shared by all heads.
  std::vector<Layout> layouts;
  QkvOrder order = QkvOrder::bshd;
  double scale = 0;     // scores are scaled by this; 0: 1 / sqrt(head_dim)
  bool causal = false;  // key positions after the query's are masked (inside the diagonal blocks)
  // Empty, or [batch, seq_k]: 0 marks a padded key, masked for every query.
  std::vector<std::uint8_t> key_padding;
  // Empty, or false for (head, query, key) pairs masked inside their blocks.
  std::function<bool(std::int64_t head, std::int64_t query, std::int64_t key)> element_mask;
};

// Index of element (b, s, h, d) of a Q-shaped tensor of `seq` positions in p's order.
std::int64_t qkv_index(const AttentionProblem& p, std::int64_t seq, std::int64_t b, std::int64_t s, std::int64_t h,
                       std::int64_t d);
// Index of the element of a K-shaped tensor (heads / kv_group heads) that query head h reads.
std::int64_t kv_index(const AttentionProblem& p, std::int64_t seq, std::int64_t b, std::int64_t s, std::int64_t h,
                      std::int64_t d);

// Whether query q of head h, batch b attends key k: its block is in the head's layout and no mask
// removes it.
bool attends(const AttentionProblem& p, std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k);

struct AttentionForward {
  std::vector<double> out;  // like q
  std::vector<double> lse;  // [batch, heads, seq_q]: log Σ exp(scaled score) over attended keys; -inf for none
};
// A query that attends no key gets a zero output row.
AttentionForward attention_forward(const AttentionProblem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v);

struct AttentionGrads {
  std::vector<double> dq, dk, dv;
};
AttentionGrads attention_backward(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dout);

// The decomposed ops. A block-sparse tensor holds [batch, heads, blocks of the head's layout,
// block, block] values: the head's nonzero blocks in layout order (row-major), each row-major.
std::int64_t block_sparse_size(const AttentionProblem& p);

// nt: unscaled q · kᵀ on the nonzero blocks.
std::vector<double> block_scores(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k);
// Softmax over each query row of scale · scores, over the attended keys only; masked entries and
// rows with no key are 0.
std::vector<double> block_softmax(const AttentionProblem& p, const std::vector<double>& scores);
// nn: probs · v, shaped like q.
std::vector<double> block_probs_v(const AttentionProblem& p, const std::vector<double>& probs,
                                  const std::vector<double>& v);
// tn: probsᵀ · x for x shaped like q (dV = Pᵀ · dO, dK = dSᵀ · Q), shaped like k (summed over each
// key/value head's query heads).
std::vector<double> block_probs_t(const AttentionProblem& p, const std::vector<double>& probs,
                                  const std::vector<double>& x);
// Gradient of the scores from the probabilities and their gradient dprobs (= dO · vᵀ on the
// blocks): scale · P ∘ (dP − rowsum(dP ∘ P)).
std::vector<double> block_softmax_grad(const AttentionProblem& p, const std::vector<double>& probs,
                                       const std::vector<double>& dprobs);

}  // namespace bsjit::reference
