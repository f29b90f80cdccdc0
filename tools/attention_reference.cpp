#include "attention_reference.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "bsjit/error.hpp"

namespace bsjit::reference {
namespace {

const Layout& layout_of(const AttentionProblem& p, std::int64_t h) {
  return p.layouts.size() == 1 ? p.layouts[0] : p.layouts[h];
}

double scale_of(const AttentionProblem& p) {
  return p.scale != 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
}

void check(const AttentionProblem& p) {
  const bool shape_ok = p.batch > 0 && p.heads > 0 && p.head_dim > 0 && p.block > 0 && p.seq_q % p.block == 0 &&
                        p.seq_k % p.block == 0 && p.kv_group > 0 && p.heads % p.kv_group == 0 &&
                        (p.layouts.size() == 1 || static_cast<std::int64_t>(p.layouts.size()) == p.heads);
  if (!shape_ok) throw Error("attention reference: inconsistent problem shape");
  for (const auto& l : p.layouts)
    if (l.rows() != p.seq_q / p.block || l.cols() != p.seq_k / p.block)
      throw Error(fmt::format("attention reference: layout [{}, {}] does not match {} × {} positions at block {}",
                              l.rows(), l.cols(), p.seq_q, p.seq_k, p.block));
  if (!p.key_padding.empty() && static_cast<std::int64_t>(p.key_padding.size()) != p.batch * p.seq_k)
    throw Error("attention reference: key_padding must hold batch × seq_k entries");
}

// Σ_d a[i, d] · c[j, d] of head h, a shaped like Q, c like K.
double dot(const AttentionProblem& p, const std::vector<double>& a, std::int64_t a_seq, std::int64_t b,
           std::int64_t i, const std::vector<double>& c, std::int64_t c_seq, std::int64_t j, std::int64_t h) {
  double s = 0;
  for (std::int64_t d = 0; d < p.head_dim; ++d)
    s += a[qkv_index(p, a_seq, b, i, h, d)] * c[kv_index(p, c_seq, b, j, h, d)];
  return s;
}

// First block of each head in a block-sparse tensor's per-batch slice, and the slice's size.
std::vector<std::int64_t> head_offsets(const AttentionProblem& p) {
  std::vector<std::int64_t> off{0};
  for (std::int64_t h = 0; h < p.heads; ++h) off.push_back(off.back() + layout_of(p, h).blocks());
  return off;
}

// Calls fn(row index base, query, key block column, block index) for every (query, nonzero block of
// the query's block row) of head h, batch b; base indexes the block's row `query % block`.
template <class Fn>
void for_each_row_block(const AttentionProblem& p, const std::vector<std::int64_t>& off, std::int64_t b,
                        std::int64_t h, std::int64_t q, Fn fn) {
  const Layout& l = layout_of(p, h);
  const std::int64_t r = q / p.block, bs = p.block * p.block;
  for (std::int64_t c = 0; c < l.cols(); ++c) {
    const std::int64_t i = l.block_index(r, c);
    if (i < 0) continue;
    fn(((b * off.back() + off[h] + i) * bs) + (q % p.block) * p.block, c);
  }
}

}  // namespace

std::int64_t qkv_index(const AttentionProblem& p, std::int64_t seq, std::int64_t b, std::int64_t s, std::int64_t h,
                       std::int64_t d) {
  return p.order == QkvOrder::bshd ? ((b * seq + s) * p.heads + h) * p.head_dim + d
                                   : ((b * p.heads + h) * seq + s) * p.head_dim + d;
}

std::int64_t kv_index(const AttentionProblem& p, std::int64_t seq, std::int64_t b, std::int64_t s, std::int64_t h,
                      std::int64_t d) {
  const std::int64_t heads = p.heads / p.kv_group, kh = h / p.kv_group;
  return p.order == QkvOrder::bshd ? ((b * seq + s) * heads + kh) * p.head_dim + d
                                   : ((b * heads + kh) * seq + s) * p.head_dim + d;
}

bool attends(const AttentionProblem& p, std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) {
  if (!layout_of(p, h).at(q / p.block, k / p.block)) return false;
  if (p.causal && k > q) return false;
  if (!p.key_padding.empty() && p.key_padding[b * p.seq_k + k] == 0) return false;
  return !p.element_mask || p.element_mask(h, q, k);
}

AttentionForward attention_forward(const AttentionProblem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v) {
  check(p);
  const double scale = scale_of(p);
  AttentionForward f;
  f.out.assign(q.size(), 0.0);
  f.lse.assign(p.batch * p.heads * p.seq_q, -std::numeric_limits<double>::infinity());
  std::vector<double> s(p.seq_k);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          s[j] = attends(p, b, h, i, j) ? scale * dot(p, q, p.seq_q, b, i, k, p.seq_k, j, h)
                                        : -std::numeric_limits<double>::infinity();
          m = std::max(m, s[j]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // no key: zero row, lse -inf
        double sum = 0;
        for (std::int64_t j = 0; j < p.seq_k; ++j) sum += std::exp(s[j] - m);
        const double lse = m + std::log(sum);
        f.lse[(b * p.heads + h) * p.seq_q + i] = lse;
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          const double w = std::exp(s[j] - lse);
          if (w == 0) continue;
          for (std::int64_t d = 0; d < p.head_dim; ++d)
            f.out[qkv_index(p, p.seq_q, b, i, h, d)] += w * v[kv_index(p, p.seq_k, b, j, h, d)];
        }
      }
  return f;
}

AttentionGrads attention_backward(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dout) {
  const AttentionForward f = attention_forward(p, q, k, v);
  const double scale = scale_of(p);
  AttentionGrads g{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
                   std::vector<double>(v.size(), 0.0)};
  std::vector<double> prob(p.seq_k), dprob(p.seq_k);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const double lse = f.lse[(b * p.heads + h) * p.seq_q + i];
        if (lse == -std::numeric_limits<double>::infinity()) continue;
        double row = 0;  // Σ_j P_ij dP_ij
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          prob[j] = attends(p, b, h, i, j) ? std::exp(scale * dot(p, q, p.seq_q, b, i, k, p.seq_k, j, h) - lse) : 0;
          dprob[j] = prob[j] != 0 ? dot(p, dout, p.seq_q, b, i, v, p.seq_k, j, h) : 0;
          row += prob[j] * dprob[j];
        }
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          if (prob[j] == 0) continue;
          const double ds = scale * prob[j] * (dprob[j] - row);
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            const std::int64_t qi = qkv_index(p, p.seq_q, b, i, h, d), kj = kv_index(p, p.seq_k, b, j, h, d);
            g.dv[kj] += prob[j] * dout[qi];
            g.dq[qi] += ds * k[kj];
            g.dk[kj] += ds * q[qi];
          }
        }
      }
  return g;
}

std::int64_t block_sparse_size(const AttentionProblem& p) {
  return p.batch * head_offsets(p).back() * p.block * p.block;
}

std::vector<double> block_scores(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k) {
  check(p);
  const auto off = head_offsets(p);
  std::vector<double> out(block_sparse_size(p), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) {
          for (std::int64_t jj = 0; jj < p.block; ++jj)
            out[base + jj] = dot(p, q, p.seq_q, b, i, k, p.seq_k, c * p.block + jj, h);
        });
  return out;
}

std::vector<double> block_softmax(const AttentionProblem& p, const std::vector<double>& scores) {
  check(p);
  const auto off = head_offsets(p);
  const double scale = scale_of(p);
  std::vector<double> out(scores.size(), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        auto each = [&](auto fn) {
          for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) {
            for (std::int64_t jj = 0; jj < p.block; ++jj)
              if (attends(p, b, h, i, c * p.block + jj)) fn(base + jj);
          });
        };
        each([&](std::int64_t e) { m = std::max(m, scale * scores[e]); });
        if (m == -std::numeric_limits<double>::infinity()) continue;
        each([&](std::int64_t e) { sum += std::exp(scale * scores[e] - m); });
        each([&](std::int64_t e) { out[e] = std::exp(scale * scores[e] - m) / sum; });
      }
  return out;
}

namespace {

// probs · x (x shaped like k, result like q) or, transposed, probsᵀ · x (x like q, result like k).
std::vector<double> probs_product(const AttentionProblem& p, const std::vector<double>& probs,
                                  const std::vector<double>& x, bool transposed) {
  check(p);
  const auto off = head_offsets(p);
  const std::int64_t seq_in = transposed ? p.seq_q : p.seq_k, seq_out = transposed ? p.seq_k : p.seq_q;
  std::vector<double> out(p.batch * seq_out * (transposed ? p.heads / p.kv_group : p.heads) * p.head_dim, 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) {
          for (std::int64_t jj = 0; jj < p.block; ++jj) {
            const std::int64_t key = c * p.block + jj, from = transposed ? i : key, to = transposed ? key : i;
            for (std::int64_t d = 0; d < p.head_dim; ++d)
              out[transposed ? kv_index(p, seq_out, b, to, h, d) : qkv_index(p, seq_out, b, to, h, d)] +=
                  probs[base + jj] *
                  x[transposed ? qkv_index(p, seq_in, b, from, h, d) : kv_index(p, seq_in, b, from, h, d)];
          }
        });
  return out;
}

}  // namespace

std::vector<double> block_probs_v(const AttentionProblem& p, const std::vector<double>& probs,
                                  const std::vector<double>& v) {
  return probs_product(p, probs, v, false);
}

std::vector<double> block_probs_t(const AttentionProblem& p, const std::vector<double>& probs,
                                  const std::vector<double>& x) {
  return probs_product(p, probs, x, true);
}

std::vector<double> block_softmax_grad(const AttentionProblem& p, const std::vector<double>& probs,
                                       const std::vector<double>& dprobs) {
  check(p);
  const auto off = head_offsets(p);
  const double scale = scale_of(p);
  std::vector<double> out(probs.size(), 0.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        double row = 0;
        for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t) {
          for (std::int64_t jj = 0; jj < p.block; ++jj) row += probs[base + jj] * dprobs[base + jj];
        });
        for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t) {
          for (std::int64_t jj = 0; jj < p.block; ++jj)
            out[base + jj] = scale * probs[base + jj] * (dprobs[base + jj] - row);
        });
      }
  return out;
}

}  // namespace bsjit::reference
