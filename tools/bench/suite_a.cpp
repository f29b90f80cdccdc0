#include "suite_a.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "baselines.hpp"
#include "bsjit/bsjit.hpp"
#include "device_buffer.hpp"
#include "reference.hpp"

namespace bsjit::bench {
namespace {

constexpr std::int64_t kBatch = 4, kHeads = 16, kSeq = 8192;

double bf16_value(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Normwise relative error of dQ, dK and dV (bf16) on sampled rows of (batch 0, head 5), each
// tensor's largest difference over its largest reference element on those rows (per row, query row
// 0's dQ, exactly 0 where it attends one key, read rounding noise of 1e-8 as an error of 1e22), against
// double sums: dQ of a query row from its own softmax (O(S · d) a row); dK and dV of a key row over
// the query rows attending it, with their probabilities from the forward's lse and D = rowsum(dO ∘
// O) from its output (both checked: lse against the sampled rows' own sums here, O by the
// forward's check), so that no sampled row costs the whole S² · d.
// With a key/value group (group query heads per key/value head: K, V, dK and dV of kHeads / group
// heads), dK and dV of head 5's key/value head sum over its group's query heads.
double backward_error(const Layout& mask, int block, int d, int group, const std::vector<std::uint16_t>& q,
                      const std::vector<std::uint16_t>& k, const std::vector<std::uint16_t>& v,
                      const std::vector<std::uint16_t>& go, const std::vector<std::uint16_t>& out,
                      const std::vector<float>& lse, const std::vector<std::uint16_t>& gq,
                      const std::vector<std::uint16_t>& gk, const std::vector<std::uint16_t>& gv) {
  const std::int64_t head = 0 * kHeads + 5, kv_base = (0 * kHeads / group + 5 / group) * kSeq * d;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  // element e of row `row` of query head h's Q-shaped tensor x, or of the key/value head's K-shaped one
  const auto at_q = [&](const std::vector<std::uint16_t>& x, std::int64_t h, std::int64_t row, int e) {
    return bf16_value(x[h * kSeq * d + row * d + e]);
  };
  const auto at_k = [&](const std::vector<std::uint16_t>& x, std::int64_t row, int e) {
    return bf16_value(x[kv_base + row * d + e]);
  };
  const auto at = [&](const std::vector<std::uint16_t>& x, std::int64_t row, int e) { return at_q(x, head, row, e); };
  const auto attends = [&](std::int64_t i, std::int64_t j) { return j <= i && mask.at(i / block, j / block); };
  const auto score = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
    double dot = 0;
    for (int e = 0; e < d; ++e) dot += at_q(q, h, i, e) * at_k(k, j, e);
    return dot * scale;
  };
  const auto dot_go = [&](std::int64_t h, std::int64_t i, const std::vector<std::uint16_t>& x, std::int64_t j) {
    double dot = 0;
    for (int e = 0; e < d; ++e) dot += at_q(go, h, i, e) * at_k(x, j, e);
    return dot;
  };
  double err = 0;
  struct Difference {
    double worst = 0, norm = 0;
  } dq, dk, dv;
  const auto compare = [&](Difference& diff, const std::vector<double>& want, const std::vector<std::uint16_t>& got,
                           std::int64_t row, bool keys) {
    for (int e = 0; e < d; ++e) {
      const double g = keys ? at_k(got, row, e) : at(got, row, e);
      diff.worst = std::isfinite(g) ? std::max(diff.worst, std::abs(g - want[e])) : INFINITY;
      diff.norm = std::max(diff.norm, std::abs(want[e]));
    }
  };
  const std::int64_t rows[] = {0, 777, kSeq / 2 + 3, kSeq - 1};
  for (std::int64_t i : rows) {  // dQ_i = scale Σ_j P_ij (dP_ij - D_i) k_j, D_i = Σ_j P_ij dP_ij
    std::vector<std::int64_t> keys;
    std::vector<double> s;
    double m = -INFINITY;
    for (std::int64_t j = 0; j <= i; ++j)
      if (attends(i, j)) keys.push_back(j), s.push_back(score(head, i, j)), m = std::max(m, s.back());
    double sum = 0;
    for (double x : s) sum += std::exp(x - m);
    err = std::max(err, std::abs(static_cast<double>(lse[head * kSeq + i]) - (m + std::log(sum))) /
                            std::max(1.0, std::abs(m + std::log(sum))));
    std::vector<double> p(keys.size()), dp(keys.size());
    double big_d = 0;
    for (std::size_t t = 0; t < keys.size(); ++t) {
      p[t] = std::exp(s[t] - m) / sum, dp[t] = dot_go(head, i, v, keys[t]);
      big_d += p[t] * dp[t];
    }
    std::vector<double> want(d, 0.0);
    for (std::size_t t = 0; t < keys.size(); ++t)
      for (int e = 0; e < d; ++e) want[e] += scale * p[t] * (dp[t] - big_d) * at_k(k, keys[t], e);
    compare(dq, want, gq, i, false);
  }
  for (std::int64_t j : rows) {  // dV_j = Σ_h Σ_i P_ij dO_i, dK_j = scale Σ_h Σ_i P_ij (dP_ij - D_i) q_i
    std::vector<double> want_v(d, 0.0), want_k(d, 0.0);
    for (std::int64_t h = head / group * group; h < head / group * group + group; ++h)
      for (std::int64_t i = j; i < kSeq; ++i) {
        if (!attends(i, j)) continue;
        const double p = std::exp(score(h, i, j) - static_cast<double>(lse[h * kSeq + i]));
        double big_d = 0;
        for (int e = 0; e < d; ++e) big_d += at_q(go, h, i, e) * at_q(out, h, i, e);
        const double ds = p * (dot_go(h, i, v, j) - big_d);
        for (int e = 0; e < d; ++e) want_v[e] += p * at_q(go, h, i, e), want_k[e] += scale * ds * at_q(q, h, i, e);
      }
    compare(dv, want_v, gv, j, true);
    compare(dk, want_k, gk, j, true);
  }
  for (const Difference& diff : {dq, dk, dv}) err = std::max(err, diff.worst / std::max(diff.norm, 1e-30));
  return err;
}

}  // namespace

std::vector<AttentionRow> run_suite_a(CUstream stream, int reps) {
  std::vector<AttentionRow> rows;
  for (int d : {128, 64}) {
    const std::size_t n = static_cast<std::size_t>(kBatch * kHeads * kSeq * d);
    const auto q = random_bf16_bits(n, 1), k = random_bf16_bits(n, 2), v = random_bf16_bits(n, 3),
               go = random_bf16_bits(n, 4);  // dO: inputs of their own, not one buffer as two
    tools::DeviceBuffer dq(n * 2), dk(n * 2), dv(n * 2), dout(n * 2), dlse(kBatch * kHeads * kSeq * 4), dgo(n * 2);
    tools::DeviceBuffer dgq(n * 2), dgk(n * 2), dgv(n * 2);  // the gradients
    dq.upload(q), dk.upload(k), dv.upload(v), dgo.upload(go);
    for (int block : {128, 64}) {
      const std::int64_t blocks = kSeq / block;
      // the masks, and one grouped-query case: 16 query heads over 2 key/value heads (K and V the
      // first eighth of their buffers, [batch, 2, seq, d])
      struct Case {
        std::string name;
        Layout mask;
        int group;
      };
      const Case cases[] = {
          {"causal", layouts::causal(blocks), 1},
          {"window1024+global256",
           layouts::unite(layouts::sliding_window(blocks, 1024 / block), layouts::global_tokens(blocks, 256 / block)),
           1},
          {"causal, 2 kv heads", layouts::causal(blocks), kHeads / 2}};
      for (const auto& [name, mask, group] : cases) {
        Attention attn({mask}, {block, d, DType::bf16, QkvOrder::bhsd, true, "", group});
        auto fn = [&] {
          attn.forward(dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()), kBatch, kHeads,
                       stream);
        };
        fn();
        BSJIT_CU(runtime::driver().cuStreamSynchronize(stream));
        // check 4 rows of (batch 0, head 5) against a double-precision computation
        const auto out = dout.download<std::uint16_t>();
        double err = 0;
        const double scale = 1 / std::sqrt(static_cast<double>(d));
        for (std::int64_t i : {std::int64_t{0}, std::int64_t{777}, kSeq / 2 + 3, kSeq - 1}) {
          const std::int64_t base = (0 * kHeads + 5) * kSeq * d, kv_base = (0 * kHeads / group + 5 / group) * kSeq * d;
          std::vector<double> s;
          double m = -INFINITY;
          for (std::int64_t j = 0; j <= i; ++j) {
            if (!mask.at(i / block, j / block)) {
              s.push_back(-INFINITY);
              continue;
            }
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += bf16_value(q[base + i * d + e]) * bf16_value(k[kv_base + j * d + e]);
            s.push_back(dot * scale);
            m = std::max(m, s.back());
          }
          double sum = 0;
          for (double x : s) sum += std::exp(x - m);
          double worst = 0, norm = 0;
          for (int e = 0; e < d; ++e) {
            double want = 0;
            for (std::size_t j = 0; j < s.size(); ++j)
              want += std::exp(s[j] - m) / sum * bf16_value(v[kv_base + j * d + e]);
            const double got = bf16_value(out[base + i * d + e]);
            worst = std::isfinite(got) ? std::max(worst, std::abs(got - want)) : INFINITY;
            norm = std::max(norm, std::abs(want));
          }
          err = std::max(err, worst / std::max(norm, 1e-30));
        }
        double pairs = 0;  // attended (query, key) pairs per (batch, head)
        for (const auto& [r, c] : mask.coords())
          pairs += r == c ? block * (block + 1) / 2.0 : static_cast<double>(block) * block;
        const double ms = time_ms(fn, stream, 3, reps);
        auto backward = [&] {
          attn.backward(dq.get(), dk.get(), dv.get(), dout.get(), static_cast<const float*>(dlse.get()), dgo.get(),
                        dgq.get(), dgk.get(), dgv.get(), kBatch, kHeads, stream);
        };
        for (auto* g : {&dgq, &dgk, &dgv}) BSJIT_CU(runtime::driver().cuMemsetD8(g->ptr, 0xff, g->bytes));  // NaN
        backward();
        BSJIT_CU(runtime::driver().cuStreamSynchronize(stream));
        const double bw_err =
            backward_error(mask, block, d, group, q, k, v, go, out, dlse.download<float>(),
                           dgq.download<std::uint16_t>(), dgk.download<std::uint16_t>(), dgv.download<std::uint16_t>());
        const double bw_ms = time_ms(backward, stream, 3, reps);
        // the forward through the decomposed ops: S and P as block-sparse tensors in memory
        AttentionOps ops({mask}, {block, d, DType::bf16, QkvOrder::bhsd, true, "", group});
        const std::size_t sparse = static_cast<std::size_t>(ops.sparse_elements(kHeads) * kBatch);
        tools::DeviceBuffer ds(sparse * 2), dp(sparse * 2);
        const double decomposed_ms = time_ms(
            [&] {
              ops.scores(dq.get(), dk.get(), ds.get(), kBatch, kHeads, stream);
              ops.softmax(ds.get(), dp.get(), kBatch, kHeads, stream);
              ops.probs_v(dp.get(), dv.get(), dgq.get(), kBatch, kHeads, stream);
            },
            stream, 3, reps);
        rows.push_back(
            {name, block, d, ms, 4.0 * kBatch * kHeads * pairs * d / ms / 1e9, err, bw_ms, bw_err, decomposed_ms});
        fmt::print(
            "suite A  {:22} b{:<3} d{:<3} {:8.3f} ms {:7.1f} TF/s  err {:.1e}{}  backward {:8.3f} ms {:7.1f} TF/s  "
            "err {:.1e}{}  decomposed forward {:8.3f} ms\n",
            name, block, d, ms, rows.back().tflops, err, err <= 1e-2 ? "" : "  WRONG", bw_ms,
            10.0 * kBatch * kHeads * pairs * d / bw_ms / 1e9, bw_err, bw_err <= 1e-2 ? "" : "  WRONG", decomposed_ms);
        std::fflush(stdout);
      }
    }
  }
  return rows;
}

}  // namespace bsjit::bench
