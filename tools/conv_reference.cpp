#include "conv_reference.hpp"

#include <algorithm>
#include <cmath>

#include "bsjit/error.hpp"

namespace bsjit::reference {

namespace {

// `groups` blocks of c_block → k_block consecutive channels, block g starting at input channel
// g · c_step and output channel g · k_step (steps below the block sizes overlap).
ConvLayout stepped_blocks(int groups, int c_block, int k_block, int c_step, int k_step) {
  std::vector<ConvBlock> blocks;
  for (int g = 0; g < groups; ++g) {
    ConvBlock b;
    for (int i = 0; i < c_block; ++i) b.c.push_back(g * c_step + i);
    for (int i = 0; i < k_block; ++i) b.k.push_back(g * k_step + i);
    blocks.push_back(b);
  }
  return ConvLayout::from_blocks((groups - 1) * c_step + c_block, (groups - 1) * k_step + k_block, blocks);
}

struct Index {
  const ConvProblem& p;
  std::array<std::int64_t, 3> in, out;
  // element (n, channel, spatial) of an activation of `channels` channels over `dims`
  std::int64_t at(std::int64_t n, std::int64_t ch, std::int64_t channels, const std::array<std::int64_t, 3>& dims,
                  std::int64_t d, std::int64_t h, std::int64_t w) const {
    return p.channels_last ? (((n * dims[0] + d) * dims[1] + h) * dims[2] + w) * channels + ch
                           : (((n * channels + ch) * dims[0] + d) * dims[1] + h) * dims[2] + w;
  }
};

// Calls term(input index, output index, filter index) for every product of the convolution: each
// block, its output and input channels, each tap and output position whose input lies inside.
// dense: the filter is [K, C, T, R, S] and every (k, c) pair counts, else the layout's blocks.
template <class Term>
void for_each_term(const ConvProblem& p, bool dense, Term term) {
  const ConvGeometry& g = p.geometry;
  g.check();
  const ConvLayout& L = *p.layout;
  const Index ix{p, g.in, g.out()};
  const auto& [T, R, S] = g.filter;
  const std::int64_t taps = g.taps();
  auto run = [&](std::int64_t k, std::int64_t c, std::int64_t filter_base) {
    for (std::int64_t n = 0; n < p.n; ++n)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t r = 0; r < R; ++r)
          for (std::int64_t s = 0; s < S; ++s) {
            const std::int64_t f = filter_base + (t * R + r) * S + s;
            for (std::int64_t m = 0; m < ix.out[0]; ++m) {
              const std::int64_t d = m * g.stride[0] - g.pad_before[0] + t * g.dilation[0];
              if (d < 0 || d >= g.in[0]) continue;
              for (std::int64_t q = 0; q < ix.out[1]; ++q) {
                const std::int64_t h = q * g.stride[1] - g.pad_before[1] + r * g.dilation[1];
                if (h < 0 || h >= g.in[1]) continue;
                for (std::int64_t o = 0; o < ix.out[2]; ++o) {
                  const std::int64_t w = o * g.stride[2] - g.pad_before[2] + s * g.dilation[2];
                  if (w < 0 || w >= g.in[2]) continue;
                  term(ix.at(n, c, L.C(), g.in, d, h, w), ix.at(n, k, L.K(), ix.out, m, q, o), f);
                }
              }
            }
          }
  };
  if (dense) {
    for (std::int64_t k = 0; k < L.K(); ++k)
      for (std::int64_t c = 0; c < L.C(); ++c) run(k, c, (k * L.C() + c) * taps);
    return;
  }
  for (std::size_t b = 0; b < L.blocks().size(); ++b) {
    const ConvBlock& blk = L.blocks()[b];
    const std::int64_t base = L.filter_offset(b, taps), cb = static_cast<std::int64_t>(blk.c.size());
    for (std::size_t ki = 0; ki < blk.k.size(); ++ki)
      for (std::int64_t ci = 0; ci < cb; ++ci)
        run(blk.k[ki], blk.c[ci], base + (static_cast<std::int64_t>(ki) * cb + ci) * taps);
  }
}

void expect_size(const std::vector<double>& v, std::int64_t n, const char* what) {
  if (static_cast<std::int64_t>(v.size()) != n)
    throw Error(std::string("conv reference: ") + what + " has " + std::to_string(v.size()) + " elements, not " +
                std::to_string(n));
}

}  // namespace

ConvLayout blocksparse_grouped_layout() { return stepped_blocks(4, 32, 48, 32, 48); }
ConvLayout blocksparse_overlapping_layout() { return stepped_blocks(8, 16, 32, 8, 16); }

std::int64_t conv_input_elements(const ConvProblem& p) {
  const auto& i = p.geometry.in;
  return p.n * p.layout->C() * i[0] * i[1] * i[2];
}

std::int64_t conv_output_elements(const ConvProblem& p) {
  const auto o = p.geometry.out();
  return p.n * p.layout->K() * o[0] * o[1] * o[2];
}

std::vector<double> conv_fprop(const ConvProblem& p, const std::vector<double>& input,
                               const std::vector<double>& filter) {
  expect_size(input, conv_input_elements(p), "input");
  expect_size(filter, p.layout->filter_elements(p.geometry.taps()), "filter");
  std::vector<double> out(conv_output_elements(p), 0.0);
  for_each_term(p, false, [&](std::int64_t i, std::int64_t o, std::int64_t f) { out[o] += input[i] * filter[f]; });
  return out;
}

std::vector<double> conv_bprop(const ConvProblem& p, const std::vector<double>& grad_out,
                               const std::vector<double>& filter) {
  expect_size(grad_out, conv_output_elements(p), "output gradient");
  expect_size(filter, p.layout->filter_elements(p.geometry.taps()), "filter");
  std::vector<double> grad_in(conv_input_elements(p), 0.0);
  for_each_term(p, false,
                [&](std::int64_t i, std::int64_t o, std::int64_t f) { grad_in[i] += grad_out[o] * filter[f]; });
  return grad_in;
}

std::vector<double> conv_updat(const ConvProblem& p, const std::vector<double>& input,
                               const std::vector<double>& grad_out) {
  expect_size(input, conv_input_elements(p), "input");
  expect_size(grad_out, conv_output_elements(p), "output gradient");
  std::vector<double> grad_filter(p.layout->filter_elements(p.geometry.taps()), 0.0);
  for_each_term(p, false,
                [&](std::int64_t i, std::int64_t o, std::int64_t f) { grad_filter[f] += input[i] * grad_out[o]; });
  return grad_filter;
}

std::vector<double> dense_filter(const ConvProblem& p, const std::vector<double>& filter) {
  const ConvLayout& L = *p.layout;
  const std::int64_t taps = p.geometry.taps();
  expect_size(filter, L.filter_elements(taps), "filter");
  std::vector<double> dense(L.K() * L.C() * taps, 0.0);
  for (std::size_t b = 0; b < L.blocks().size(); ++b) {
    const ConvBlock& blk = L.blocks()[b];
    const std::int64_t base = L.filter_offset(b, taps), cb = static_cast<std::int64_t>(blk.c.size());
    for (std::size_t ki = 0; ki < blk.k.size(); ++ki)
      for (std::int64_t ci = 0; ci < cb; ++ci)
        for (std::int64_t t = 0; t < taps; ++t)
          dense[(blk.k[ki] * L.C() + blk.c[ci]) * taps + t] +=
              filter[base + (static_cast<std::int64_t>(ki) * cb + ci) * taps + t];
  }
  return dense;
}

std::vector<double> dense_conv_fprop(const ConvProblem& p, const std::vector<double>& input,
                                     const std::vector<double>& dense) {
  expect_size(input, conv_input_elements(p), "input");
  expect_size(dense, p.layout->K() * p.layout->C() * p.geometry.taps(), "dense filter");
  std::vector<double> out(conv_output_elements(p), 0.0);
  for_each_term(p, true, [&](std::int64_t i, std::int64_t o, std::int64_t f) { out[o] += input[i] * dense[f]; });
  return out;
}

std::vector<std::vector<std::int64_t>> conv_filter_rows(const ConvLayout& layout, std::int64_t taps, bool deconv) {
  std::vector<std::vector<std::int64_t>> rows;
  for (std::size_t i = 0; i < layout.blocks().size(); ++i) {
    const std::int64_t cb = static_cast<std::int64_t>(layout.blocks()[i].c.size()),
                       kb = static_cast<std::int64_t>(layout.blocks()[i].k.size()), at = layout.filter_offset(i, taps);
    for (std::int64_t r = 0; r < (deconv ? cb : kb); ++r) {
      rows.emplace_back();
      for (std::int64_t o = 0; o < (deconv ? kb : cb); ++o)
        for (std::int64_t t = 0; t < taps; ++t)
          rows.back().push_back(at + (deconv ? o * cb + r : r * cb + o) * taps + t);
    }
  }
  return rows;
}

std::vector<double> conv_l2_normalize(const ConvLayout& layout, std::int64_t taps, bool deconv,
                                      const std::vector<double>& filter, const std::vector<double>& gain,
                                      double epsilon) {
  std::vector<double> out(filter.size());
  const auto rows = conv_filter_rows(layout, taps, deconv);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double s = 0;
    for (auto e : rows[i]) s += filter[e] * filter[e];
    const double scale = (gain.empty() ? 1.0 : gain[i]) / std::sqrt(std::max(s, epsilon));
    for (auto e : rows[i]) out[e] = filter[e] * scale;
  }
  return out;
}

std::pair<std::vector<double>, std::vector<double>> conv_l2_normalize_grad(
    const ConvLayout& layout, std::int64_t taps, bool deconv, const std::vector<double>& filter,
    const std::vector<double>& gain, const std::vector<double>& u, double epsilon) {
  std::vector<double> grad(filter.size()), grad_gain;
  const auto rows = conv_filter_rows(layout, taps, deconv);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double s = 0, uf = 0;
    for (auto e : rows[i]) s += filter[e] * filter[e], uf += u[e] * filter[e];
    const double m = std::max(s, epsilon), g = gain.empty() ? 1.0 : gain[i], inv = 1 / std::sqrt(m);
    grad_gain.push_back(uf * inv);
    for (auto e : rows[i]) grad[e] = (g * u[e] - (s >= epsilon ? filter[e] * g * uf / m : 0.0)) * inv;
  }
  return {std::move(grad), std::move(grad_gain)};
}

}  // namespace bsjit::reference
