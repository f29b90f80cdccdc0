// The double-precision CPU reference of block-sparse convolution (bsjit::ConvLayout): fprop, bprop
// (the input's gradient) and updat (the filter's, on the layout's blocks only), computed block by
// block as the definition reads, and the dense convolution with the layout expanded to check them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "bsjit/conv_layout.hpp"

namespace bsjit::reference {

struct ConvProblem {
  const ConvLayout* layout = nullptr;
  ConvGeometry geometry;
  std::int64_t n = 1;
  bool channels_last = false;  // activations N, D, H, W, C instead of N, C, D, H, W
};

// openai/blocksparse's own conv test layouts: 4 disjoint blocks of 32 → 48 channels (a grouped
// convolution), and 8 overlapping blocks of 16 → 32 channels at strides 8 and 16 (outputs add where
// they meet).
ConvLayout blocksparse_grouped_layout();
ConvLayout blocksparse_overlapping_layout();

// Elements of the input [n, C, D, H, W] and the output [n, K, M, P, Q] (in either order).
std::int64_t conv_input_elements(const ConvProblem& p);
std::int64_t conv_output_elements(const ConvProblem& p);

// O = conv(I, F): each block's filter [K_b, C_b, T, R, S] (the layout's filter, blocks in order)
// over its input channels, added into its output channels.
std::vector<double> conv_fprop(const ConvProblem& p, const std::vector<double>& input,
                               const std::vector<double>& filter);
// dI from dO: the adjoint of fprop in its input.
std::vector<double> conv_bprop(const ConvProblem& p, const std::vector<double>& grad_out,
                               const std::vector<double>& filter);
// dF from I and dO: the adjoint of fprop in its filter, in the layout's filter order.
std::vector<double> conv_updat(const ConvProblem& p, const std::vector<double>& input,
                               const std::vector<double>& grad_out);

// blocksparse's filter l2_normalize by its definition: the filter's rows (per block, each output
// channel's C_b · taps elements; with deconv each input channel's K_b · taps), in block order, as
// lists of element indices.
std::vector<std::vector<std::int64_t>> conv_filter_rows(const ConvLayout& layout, std::int64_t taps, bool deconv);
// Each row divided by sqrt(max(Σ row², epsilon)) and multiplied by gain[row] (empty: 1).
std::vector<double> conv_l2_normalize(const ConvLayout& layout, std::int64_t taps, bool deconv,
                                      const std::vector<double>& filter, const std::vector<double>& gain,
                                      double epsilon = 1e-12);
// Its gradients for the upstream gradient u: the filter's, and the gain's (one per row).
std::pair<std::vector<double>, std::vector<double>> conv_l2_normalize_grad(
    const ConvLayout& layout, std::int64_t taps, bool deconv, const std::vector<double>& filter,
    const std::vector<double>& gain, const std::vector<double>& u, double epsilon = 1e-12);

// The layout's filter scattered into a dense [K, C, T, R, S] one (overlapping blocks add).
std::vector<double> dense_filter(const ConvProblem& p, const std::vector<double>& filter);
// The dense convolution over every (k, c) pair of a [K, C, T, R, S] filter.
std::vector<double> dense_conv_fprop(const ConvProblem& p, const std::vector<double>& input,
                                     const std::vector<double>& dense);

}  // namespace bsjit::reference
