// The attention reference against what can be checked independently: closed forms (zero queries
// average the attended values), finite differences of the forward for the backward, the
// decomposed ops composed back into the fused forward and backward, and the two tensor orders.
#include "attention_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "bsjit/attention_layouts.hpp"
#include "bsjit/error.hpp"
#include "reference.hpp"

namespace bsjit::reference {
namespace {

std::vector<double> random_vector(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// 2 batches × 3 heads × 64 positions at block 16: per-head layouts (causal; window; a random one
// whose block row 1 is empty), causal inside blocks, a padded key in batch 1, and an element mask.
AttentionProblem masked_problem() {
  AttentionProblem p;
  p.batch = 2, p.heads = 3, p.seq_q = p.seq_k = 64, p.head_dim = 8, p.block = 16;
  p.layouts = {layouts::causal(4), layouts::sliding_window(4, 2),
               Layout::from_coords(4, 4, {{0, 0}, {2, 0}, {2, 2}, {3, 1}, {3, 3}})};
  p.causal = true;
  p.key_padding.assign(p.batch * p.seq_k, 1);
  p.key_padding[1 * p.seq_k + 5] = 0;
  p.element_mask = [](std::int64_t h, std::int64_t q, std::int64_t k) { return h != 1 || (q + k) % 7 != 0; };
  return p;
}

std::size_t qkv_size(const AttentionProblem& p, std::int64_t seq) {
  return static_cast<std::size_t>(p.batch * seq * p.heads * p.head_dim);
}

TEST(AttentionReference, ZeroQueriesAverageTheAttendedValues) {
  AttentionProblem p;
  p.heads = 2, p.seq_q = p.seq_k = 32, p.head_dim = 4, p.block = 8;
  p.layouts = {layouts::causal(4)};
  p.causal = true;
  std::mt19937_64 rng(1);
  const auto q = std::vector<double>(qkv_size(p, 32), 0.0), k = random_vector(qkv_size(p, 32), rng),
             v = random_vector(qkv_size(p, 32), rng);
  const auto f = attention_forward(p, q, k, v);
  for (std::int64_t h = 0; h < p.heads; ++h)
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      EXPECT_NEAR(f.lse[h * p.seq_q + i], std::log(static_cast<double>(i + 1)), 1e-12);  // i + 1 scores of 0
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        double mean = 0;
        for (std::int64_t j = 0; j <= i; ++j) mean += v[qkv_index(p, p.seq_k, 0, j, h, d)];
        EXPECT_NEAR(f.out[qkv_index(p, p.seq_q, 0, i, h, d)], mean / (i + 1), 1e-12);
      }
    }
}

TEST(AttentionReference, RowsWithNoKeyAreZeroWithMinusInfinityLse) {
  AttentionProblem p = masked_problem();
  std::mt19937_64 rng(2);
  const auto q = random_vector(qkv_size(p, 64), rng), k = random_vector(qkv_size(p, 64), rng),
             v = random_vector(qkv_size(p, 64), rng), dout = random_vector(qkv_size(p, 64), rng);
  const auto f = attention_forward(p, q, k, v);
  const auto g = attention_backward(p, q, k, v, dout);
  int empty = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 16; i < 32; ++i) {  // head 2's block row 1 has no block
      EXPECT_EQ(f.lse[(b * p.heads + 2) * p.seq_q + i], -std::numeric_limits<double>::infinity());
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        EXPECT_EQ(f.out[qkv_index(p, p.seq_q, b, i, 2, d)], 0.0);
        EXPECT_EQ(g.dq[qkv_index(p, p.seq_q, b, i, 2, d)], 0.0);
      }
      ++empty;
    }
  EXPECT_EQ(empty, 32);
  for (double x : f.out) EXPECT_TRUE(std::isfinite(x));
}

TEST(AttentionReference, DecomposedOpsComposeIntoTheFusedForwardAndBackward) {
  AttentionProblem p = masked_problem();
  std::mt19937_64 rng(3);
  const auto q = random_vector(qkv_size(p, 64), rng), k = random_vector(qkv_size(p, 64), rng),
             v = random_vector(qkv_size(p, 64), rng), dout = random_vector(qkv_size(p, 64), rng);
  const auto probs = block_softmax(p, block_scores(p, q, k));
  ASSERT_EQ(static_cast<std::int64_t>(probs.size()), block_sparse_size(p));
  EXPECT_LT(relative_error(block_probs_v(p, probs, v), attention_forward(p, q, k, v).out), 1e-12);

  const auto g = attention_backward(p, q, k, v, dout);
  const auto ds = block_softmax_grad(p, probs, block_scores(p, dout, v));  // dP = dO · Vᵀ on the blocks
  EXPECT_LT(relative_error(block_probs_t(p, probs, dout), g.dv), 1e-12);
  EXPECT_LT(relative_error(block_probs_v(p, ds, k), g.dq), 1e-12);
  EXPECT_LT(relative_error(block_probs_t(p, ds, q), g.dk), 1e-12);
}

// d/dε Σ out(x + ε·u) ∘ dO at ε = 0, by central differences, against Σ grad ∘ u.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  AttentionProblem p = masked_problem();
  p.batch = 1, p.key_padding.assign(p.seq_k, 1), p.key_padding[9] = 0;
  std::mt19937_64 rng(4);
  const auto q = random_vector(qkv_size(p, 64), rng), k = random_vector(qkv_size(p, 64), rng),
             v = random_vector(qkv_size(p, 64), rng), dout = random_vector(qkv_size(p, 64), rng);
  const auto g = attention_backward(p, q, k, v, dout);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    const auto out = attention_forward(p, qq, kk, vv).out;
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += out[i] * dout[i];
    return s;
  };
  const double eps = 1e-5;
  for (int which = 0; which < 3; ++which) {
    const auto u = random_vector(q.size(), rng);
    auto moved = [&](double e) {
      std::vector<double> x[3] = {q, k, v};
      for (std::size_t i = 0; i < u.size(); ++i) x[which][i] += e * u[i];
      return loss(x[0], x[1], x[2]);
    };
    const double numeric = (moved(eps) - moved(-eps)) / (2 * eps);
    const std::vector<double>& grad = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
    double analytic = 0;
    for (std::size_t i = 0; i < u.size(); ++i) analytic += grad[i] * u[i];
    EXPECT_NEAR(numeric, analytic, 1e-6 * std::max(1.0, std::abs(analytic))) << "operand " << which;
  }
}

TEST(AttentionReference, BothTensorOrdersGiveTheSameAttention) {
  AttentionProblem p = masked_problem();
  std::mt19937_64 rng(5);
  const auto q = random_vector(qkv_size(p, 64), rng), k = random_vector(qkv_size(p, 64), rng),
             v = random_vector(qkv_size(p, 64), rng);
  AttentionProblem t = p;
  t.order = QkvOrder::bhsd;
  auto reorder = [&](const std::vector<double>& x) {  // bshd → bhsd
    std::vector<double> y(x.size());
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t s = 0; s < p.seq_q; ++s)
        for (std::int64_t h = 0; h < p.heads; ++h)
          for (std::int64_t d = 0; d < p.head_dim; ++d)
            y[qkv_index(t, p.seq_q, b, s, h, d)] = x[qkv_index(p, p.seq_q, b, s, h, d)];
    return y;
  };
  const auto a = attention_forward(p, q, k, v), b = attention_forward(t, reorder(q), reorder(k), reorder(v));
  EXPECT_LT(relative_error(reorder(a.out), b.out), 1e-15);
  EXPECT_EQ(a.lse, b.lse);
}

// Grouped-query attention is multi-head attention on K and V repeated over each group's query
// heads, with dK and dV summed over the group; the decomposed ops compose into it too. Both orders.
TEST(AttentionReference, GroupedQueriesAreRepeatedKeysAndSummedGradients) {
  for (QkvOrder order : {QkvOrder::bshd, QkvOrder::bhsd}) {
    AttentionProblem grouped = masked_problem();
    grouped.heads = 4, grouped.order = order, grouped.kv_group = 2;
    grouped.layouts.push_back(layouts::sliding_window(4, 1));
    grouped.element_mask = nullptr;
    AttentionProblem multi = grouped;
    multi.kv_group = 1;
    std::mt19937_64 rng(6);
    const std::size_t n = qkv_size(grouped, 64), nk = n / 2;
    const auto q = random_vector(n, rng), dout = random_vector(n, rng), k = random_vector(nk, rng),
               v = random_vector(nk, rng);
    auto repeat = [&](const std::vector<double>& x) {  // heads / 2 → heads
      std::vector<double> y(n);
      for (std::int64_t b = 0; b < grouped.batch; ++b)
        for (std::int64_t s = 0; s < grouped.seq_k; ++s)
          for (std::int64_t h = 0; h < grouped.heads; ++h)
            for (std::int64_t d = 0; d < grouped.head_dim; ++d)
              y[qkv_index(multi, grouped.seq_k, b, s, h, d)] = x[kv_index(grouped, grouped.seq_k, b, s, h, d)];
      return y;
    };
    auto sum = [&](const std::vector<double>& y) {  // heads → heads / 2
      std::vector<double> x(nk, 0.0);
      for (std::int64_t b = 0; b < grouped.batch; ++b)
        for (std::int64_t s = 0; s < grouped.seq_k; ++s)
          for (std::int64_t h = 0; h < grouped.heads; ++h)
            for (std::int64_t d = 0; d < grouped.head_dim; ++d)
              x[kv_index(grouped, grouped.seq_k, b, s, h, d)] += y[qkv_index(multi, grouped.seq_k, b, s, h, d)];
      return x;
    };
    const auto a = attention_forward(grouped, q, k, v), b = attention_forward(multi, q, repeat(k), repeat(v));
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.lse, b.lse);
    const auto ga = attention_backward(grouped, q, k, v, dout),
               gb = attention_backward(multi, q, repeat(k), repeat(v), dout);
    EXPECT_EQ(ga.dq, gb.dq);
    EXPECT_LT(relative_error(ga.dk, sum(gb.dk)), 1e-14);
    EXPECT_LT(relative_error(ga.dv, sum(gb.dv)), 1e-14);
    EXPECT_EQ(ga.dk.size(), nk);
    // the decomposed ops
    const auto probs = block_softmax(grouped, block_scores(grouped, q, k));
    EXPECT_LT(relative_error(block_probs_v(grouped, probs, v), a.out), 1e-12);
    const auto ds = block_softmax_grad(grouped, probs, block_scores(grouped, dout, v));
    EXPECT_LT(relative_error(block_probs_t(grouped, probs, dout), ga.dv), 1e-12);
    EXPECT_LT(relative_error(block_probs_t(grouped, ds, q), ga.dk), 1e-12);
    EXPECT_LT(relative_error(block_probs_v(grouped, ds, k), ga.dq), 1e-12);
  }
  AttentionProblem bad = masked_problem();
  bad.kv_group = 2;  // 3 heads
  std::vector<double> x(qkv_size(bad, 64), 0.0);
  EXPECT_THROW(attention_forward(bad, x, x, x), Error);
}

TEST(AttentionReference, RejectsInconsistentShapes) {
  AttentionProblem p = masked_problem();
  p.layouts.pop_back();  // 2 layouts for 3 heads
  std::vector<double> x(qkv_size(p, 64), 0.0);
  EXPECT_THROW(attention_forward(p, x, x, x), Error);
  p = masked_problem();
  p.layouts = {layouts::causal(8)};  // 8 block rows for 64 positions at block 16
  EXPECT_THROW(attention_forward(p, x, x, x), Error);
}

}  // namespace
}  // namespace bsjit::reference
