#include "attention_reference.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "bsjit/error.hpp"
#include "runtime/parallel.hpp"

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

namespace {

// The attention's masks with the block masks expanded to dense bytes: attends() without a search
// of the layout per pair, safe to call from many threads.
class Mask {
 public:
  explicit Mask(const AttentionProblem& p) : p_(p), cols_(p.seq_k / p.block) {
    for (const Layout& l : p.layouts) {
      auto& m = dense_.emplace_back(static_cast<std::size_t>(l.rows() * l.cols()), 0);
      for (std::int64_t i = 0; i < l.blocks(); ++i) {
        const auto [r, c] = l.block_coord(i);
        m[r * cols_ + c] = 1;
      }
    }
  }
  // Whether block (r, c) of head h's layout is nonzero.
  bool block(std::int64_t h, std::int64_t r, std::int64_t c) const {
    return dense_[dense_.size() == 1 ? 0 : h][r * cols_ + c] != 0;
  }
  // attends() of the public interface.
  bool operator()(std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) const {
    if (!block(h, q / p_.block, k / p_.block)) return false;
    if (p_.causal && k > q) return false;
    if (!p_.key_padding.empty() && p_.key_padding[b * p_.seq_k + k] == 0) return false;
    return !p_.element_mask || p_.element_mask(h, q, k);
  }

 private:
  const AttentionProblem& p_;
  std::int64_t cols_;
  std::vector<std::vector<std::uint8_t>> dense_;
};

double dot_rows(const double* a, const double* c, std::int64_t n) {
  double s = 0;
  for (std::int64_t d = 0; d < n; ++d) s += a[d] * c[d];
  return s;
}

// Calls fn(i) for i in [0, n) over the cores, in chunks of `chunk` consecutive indices. Every
// element of a result is summed by one call in a fixed order, so the values do not depend on the
// number of threads (at S = 256, 2 batches and 4 heads, one backward took about 1 s on one core).
template <class Fn>
void over(std::int64_t n, std::int64_t chunk, Fn fn) {
  runtime::parallel_for(static_cast<std::size_t>((n + chunk - 1) / chunk), 0, [&](std::size_t c) {
    const std::int64_t i0 = static_cast<std::int64_t>(c) * chunk;
    for (std::int64_t i = i0; i < std::min(n, i0 + chunk); ++i) fn(i);
  });
}

// fn(b, h, i) for every query row over the cores: for results whose rows are disjoint.
template <class Fn>
void over_rows(const AttentionProblem& p, Fn fn) {
  over(p.batch * p.heads * p.seq_q, 16,
       [&](std::int64_t row) { fn(row / p.seq_q / p.heads, row / p.seq_q % p.heads, row % p.seq_q); });
}

}  // namespace

AttentionForward attention_forward(const AttentionProblem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v) {
  check(p);
  const Mask mask(p);
  const double scale = scale_of(p);
  const double minus_inf = -std::numeric_limits<double>::infinity();
  AttentionForward f;
  f.out.assign(q.size(), 0.0);
  f.lse.assign(p.batch * p.heads * p.seq_q, minus_inf);
  // rows (b, h, i) in lse's order
  over(p.batch * p.heads * p.seq_q, 16, [&](std::int64_t row) {
    const std::int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads, b = row / p.seq_q / p.heads;
    const double* qi = &q[qkv_index(p, p.seq_q, b, i, h, 0)];
    double* out = &f.out[qkv_index(p, p.seq_q, b, i, h, 0)];
    thread_local std::vector<double> s;  // (no allocation a row)
    s.assign(p.seq_k, minus_inf);
    double m = minus_inf;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      if (!mask(b, h, i, j)) continue;
      s[j] = scale * dot_rows(qi, &k[kv_index(p, p.seq_k, b, j, h, 0)], p.head_dim);
      m = std::max(m, s[j]);
    }
    if (m == minus_inf) return;  // no key: zero row, lse -inf
    double sum = 0;
    for (std::int64_t j = 0; j < p.seq_k; ++j) sum += std::exp(s[j] - m);
    const double lse = m + std::log(sum);
    f.lse[row] = lse;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      const double w = std::exp(s[j] - lse);
      if (w == 0) continue;
      const double* vj = &v[kv_index(p, p.seq_k, b, j, h, 0)];
      for (std::int64_t d = 0; d < p.head_dim; ++d) out[d] += w * vj[d];
    }
  });
  return f;
}

// In two passes, each over the cores: the rows of queries give dQ and each row's Σ_j P_ij dP_ij;
// the keys (each over its group's query heads) give dK and dV, with P and dP computed again.
AttentionGrads attention_backward(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dout) {
  const AttentionForward f = attention_forward(p, q, k, v);
  const Mask mask(p);
  const double scale = scale_of(p);
  const double minus_inf = -std::numeric_limits<double>::infinity();
  AttentionGrads g{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
                   std::vector<double>(v.size(), 0.0)};
  std::vector<double> row_sum(f.lse.size(), 0.0);  // Σ_j P_ij dP_ij, by row (b, h, i)
  over(p.batch * p.heads * p.seq_q, 16, [&](std::int64_t row) {
    const std::int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads, b = row / p.seq_q / p.heads;
    const double lse = f.lse[row];
    if (lse == minus_inf) return;
    const std::int64_t qi = qkv_index(p, p.seq_q, b, i, h, 0);
    thread_local std::vector<double> prob, dprob;
    prob.assign(p.seq_k, 0.0), dprob.assign(p.seq_k, 0.0);
    double sum = 0;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      if (!mask(b, h, i, j)) continue;
      const std::int64_t kj = kv_index(p, p.seq_k, b, j, h, 0);
      prob[j] = std::exp(scale * dot_rows(&q[qi], &k[kj], p.head_dim) - lse);
      dprob[j] = prob[j] != 0 ? dot_rows(&dout[qi], &v[kj], p.head_dim) : 0;
      sum += prob[j] * dprob[j];
    }
    row_sum[row] = sum;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      if (prob[j] == 0) continue;
      const double ds = scale * prob[j] * (dprob[j] - sum);
      const double* kj = &k[kv_index(p, p.seq_k, b, j, h, 0)];
      for (std::int64_t d = 0; d < p.head_dim; ++d) g.dq[qi + d] += ds * kj[d];
    }
  });
  // keys (b, key/value head, j); each sums over its query heads, then their rows, in order
  const std::int64_t kv_heads = p.heads / p.kv_group;
  over(p.batch * kv_heads * p.seq_k, 16, [&](std::int64_t key) {
    const std::int64_t j = key % p.seq_k, kh = key / p.seq_k % kv_heads, b = key / p.seq_k / kv_heads;
    const std::int64_t kj = kv_index(p, p.seq_k, b, j, kh * p.kv_group, 0);
    for (std::int64_t h = kh * p.kv_group; h < (kh + 1) * p.kv_group; ++h)
      for (std::int64_t r = 0; r < p.seq_q / p.block; ++r) {
        if (!mask.block(h, r, j / p.block)) continue;
        for (std::int64_t i = r * p.block; i < (r + 1) * p.block; ++i) {
          const std::int64_t row = (b * p.heads + h) * p.seq_q + i;
          if (f.lse[row] == minus_inf || !mask(b, h, i, j)) continue;
          const std::int64_t qi = qkv_index(p, p.seq_q, b, i, h, 0);
          const double prob = std::exp(scale * dot_rows(&q[qi], &k[kj], p.head_dim) - f.lse[row]);
          if (prob == 0) continue;
          const double ds = scale * prob * (dot_rows(&dout[qi], &v[kj], p.head_dim) - row_sum[row]);
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            g.dv[kj + d] += prob * dout[qi + d];
            g.dk[kj + d] += ds * q[qi + d];
          }
        }
      }
  });
  return g;
}

std::int64_t block_sparse_size(const AttentionProblem& p) {
  return p.batch * head_offsets(p).back() * p.block * p.block;
}

std::vector<double> block_scores(const AttentionProblem& p, const std::vector<double>& q, const std::vector<double>& k) {
  check(p);
  const auto off = head_offsets(p);
  std::vector<double> out(block_sparse_size(p), 0.0);
  over_rows(p, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) {
      for (std::int64_t jj = 0; jj < p.block; ++jj)
        out[base + jj] = dot(p, q, p.seq_q, b, i, k, p.seq_k, c * p.block + jj, h);
    });
  });
  return out;
}

std::vector<double> block_softmax(const AttentionProblem& p, const std::vector<double>& scores) {
  check(p);
  const auto off = head_offsets(p);
  const double scale = scale_of(p);
  std::vector<double> out(scores.size(), 0.0);
  const Mask mask(p);
  over_rows(p, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    auto each = [&](auto fn) {
      for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) {
        for (std::int64_t jj = 0; jj < p.block; ++jj)
          if (mask(b, h, i, c * p.block + jj)) fn(base + jj);
      });
    };
    each([&](std::int64_t e) { m = std::max(m, scale * scores[e]); });
    if (m == -std::numeric_limits<double>::infinity()) return;
    each([&](std::int64_t e) { sum += std::exp(scale * scores[e] - m); });
    each([&](std::int64_t e) { out[e] = std::exp(scale * scores[e] - m) / sum; });
  });
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
  // adds block (row i's block row, c) of head h's products, base indexing its row `i % block`
  auto add = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t base, std::int64_t c) {
    for (std::int64_t jj = 0; jj < p.block; ++jj) {
      const std::int64_t key = c * p.block + jj, from = transposed ? i : key, to = transposed ? key : i;
      for (std::int64_t d = 0; d < p.head_dim; ++d)
        out[transposed ? kv_index(p, seq_out, b, to, h, d) : qkv_index(p, seq_out, b, to, h, d)] +=
            probs[base + jj] * x[transposed ? qkv_index(p, seq_in, b, from, h, d) : kv_index(p, seq_in, b, from, h, d)];
    }
  };
  if (!transposed) {
    over_rows(p, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
      for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t c) { add(b, h, i, base, c); });
    });
    return out;
  }
  // a key block column of a key/value head at a time, over its query heads and their rows in order
  const std::int64_t kv_heads = p.heads / p.kv_group, cols = p.seq_k / p.block, bs = p.block * p.block;
  over(p.batch * kv_heads * cols, 1, [&](std::int64_t unit) {
    const std::int64_t c = unit % cols, kh = unit / cols % kv_heads, b = unit / cols / kv_heads;
    for (std::int64_t h = kh * p.kv_group; h < (kh + 1) * p.kv_group; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        if (const std::int64_t blk = layout_of(p, h).block_index(i / p.block, c); blk >= 0)
          add(b, h, i, (b * off.back() + off[h] + blk) * bs + (i % p.block) * p.block, c);
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
  over_rows(p, [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    double row = 0;
    for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t) {
      for (std::int64_t jj = 0; jj < p.block; ++jj) row += probs[base + jj] * dprobs[base + jj];
    });
    for_each_row_block(p, off, b, h, i, [&](std::int64_t base, std::int64_t) {
      for (std::int64_t jj = 0; jj < p.block; ++jj)
        out[base + jj] = scale * probs[base + jj] * (dprobs[base + jj] - row);
    });
  });
  return out;
}

}  // namespace bsjit::reference
