// Block-sparse convolution over channels (openai/blocksparse's BlocksparseConv and
// BlocksparseDeconv): the input's gradient and the filter's on the layout's blocks too, each
// compiled at first use.
//
//   bsjit::Conv conv(bsjit::ConvLayout::from_mask(mask, 32),
//                    bsjit::ConvGeometry::same({1, 56, 56}, {1, 3, 3}), {.dtype = bsjit::DType::bf16});
//   conv.fprop(in, filter, out, n, stream);          // O  = conv(I, F)
//   conv.bprop(grad_out, filter, grad_in, n, stream); // dI
//   conv.updat(in, grad_out, grad_filter, n, stream); // dF on the layout's blocks
//
// Shapes: the input [n, C, D, H, W] (ActivationOrder::ncdhw) or [n, D, H, W, C] (ndhwc), the output
// [n, K, M, P, Q] or [n, M, P, Q, K] with M, P, Q = geometry.out(); the filter is the blocks'
// filters [K_b, C_b, T, R, S] one after the other, in block order (ConvLayout::filter_offset). A
// deconvolution (ConvOptions::deconv) is the transposed convolution of the same layout and
// geometry: its input has the convolution's output shape, its output the convolution's input shape,
// its filter the same layout. All pointers are device pointers, 16-byte aligned, in the current CUDA
// context; calls are asynchronous on the given stream.
//
// The kernels today: a 1×1 convolution with stride 1 and no padding on a uniform layout, channels
// last, runs the matmul's kernels (generator::conv_matmul_plan); any other fp16 or bf16 convolution
// on a uniform layout of 16, 32, 64 or 128-channel blocks, channels last, runs implicit GEMM on the
// tensor cores (templates/bsjit/conv_igemm.cuh); every other one direct kernels, one output element
// per thread in fp32 (exact for fp32 inputs; fp16 and bf16 with fp32 accumulation), for every
// layout and geometry. The filter's l2_normalize (blocksparse's weight normalization) and its
// gradient run the direct way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bsjit/conv_layout.hpp"
#include "bsjit/matmul.hpp"
#include "bsjit/types.hpp"

namespace bsjit {

struct ConvOptions {
  DType dtype = DType::f32;  // of activations, filter and gradients; accumulation is fp32
  ActivationOrder order = ActivationOrder::ndhwc;
  bool deconv = false;  // the transposed convolution (blocksparse's BlocksparseDeconv)
  std::string arch;     // "sm_80", "sm_90a"...; empty: the device's
  // The direct kernels even where the tensor-core ones apply (a reference path; fp32 and layouts
  // that are not uniform always run them).
  bool direct_kernels = false;
};

enum class ConvOp { fprop, bprop, updat };

class Conv {
 public:
  // Throws Error for a geometry that check() refuses, sizes past the kernels' 32-bit dimensions,
  // a filter over 2^31 elements, more than 65535 blocks, or an unknown arch.
  Conv(ConvLayout layout, ConvGeometry geometry, ConvOptions options = {});
  ~Conv();
  Conv(Conv&&) noexcept;
  Conv& operator=(Conv&&) noexcept;

  // OpOptions: accumulate adds the result to the output; gate, a device array [blocks], scales
  // block i's contribution (fprop, bprop) or its filter gradient (updat) by gate[i], 0 skipping it;
  // workspace, the device memory the call stages in (workspace_size), given by the caller instead of
  // the one bsjit keeps per stream.
  void fprop(const void* input, const void* filter, void* output, std::int64_t n, Stream stream = nullptr,
             const OpOptions& op = {}) const;
  void bprop(const void* grad_output, const void* filter, void* grad_input, std::int64_t n, Stream stream = nullptr,
             const OpOptions& op = {}) const;
  void updat(const void* input, const void* grad_output, void* grad_filter, std::int64_t n, Stream stream = nullptr,
             const OpOptions& op = {}) const;

  // blocksparse's filter l2_normalize (weight normalization of the filter): each row of the filter
  // (a block's output channel, C_b · taps elements; a deconvolution's: a block's input channel,
  // K_b · taps) divided by sqrt(max(Σ row², epsilon)), then multiplied by gain[row] where a gain is
  // given (fp32 [normalized_rows()], rows in block order). out may be filter. sum_squares (fp32
  // [normalized_rows()]) receives each row's Σ row², which the backward takes.
  void l2_normalize(const void* filter, const float* gain, void* out, float* sum_squares, float epsilon = 1e-12f,
                    Stream stream = nullptr) const;
  // The gradients of l2_normalize: grad_filter from grad_out (they may alias), and grad_gain (fp32
  // [normalized_rows()]) where a gain was given.
  void l2_normalize_backward(const void* grad_out, const void* filter, const float* gain, const float* sum_squares,
                             void* grad_filter, float* grad_gain, float epsilon = 1e-12f,
                             Stream stream = nullptr) const;
  std::int64_t normalized_rows() const;

  // Compiles the kernels for arch into the cache without a GPU (build machines); how many were
  // compiled now. One compile per dtype, order and arch serves every layout and geometry.
  int precompile(const std::string& arch) const;
  // Loads the kernels into the current context (strict: throws when the cache lacks one), and what
  // a call keeps per context (a 1×1 convolution's block order).
  void load(bool strict = false) const;

  // Bytes of the workspace op's calls with these options take at n images on the current GPU (0:
  // none): a 1×1 convolution's matmul workspace (MatMul::workspace_size; first, so that its
  // counters lead) then its filter and gate in the matmul's block order; the tensor-core kernels'
  // filter packed per tap (fprop, bprop) or fp32 filter-gradient sums (updat). On the 1×1 path it
  // compiles or loads the matmul's kernel like a first call. A call given a workspace of this size
  // (OpOptions::workspace, 16-byte aligned, its first MatMul::workspace_counter_bytes() zero; one
  // call at a time) allocates nothing once load() or one call has run in the context, as CUDA graph
  // capture on any stream requires; without one, bsjit allocates one per stream at the stream's
  // first call.
  std::size_t workspace_size(ConvOp op, std::int64_t n, const OpOptions& call = {}) const;

  // Times every kernel bsjit can run op with at n images on the current GPU (on scratch inputs of
  // that size, on stream) and keeps the fastest for this layout, geometry, dtype, order and target:
  // on sm_90a, where the tensor-core kernels take blocks of 64 or 128 channels, every op has the
  // warpgroup kernels ("wgmma") and the mma.sync ones ("mma.sync"), and the forward direction's
  // kernel fed by TMA in im2col mode ("tma") where the geometry suits it; elsewhere an op runs its
  // one kernel ("mma.sync", "matmul" or "direct"), timed and reported. The choice is stored in
  // the cache beside the kernels: later calls, and later processes sharing the cache, use it
  // without tuning (precompile for sm_90a compiles every one).
  TuneResult autotune(ConvOp op, std::int64_t n, Stream stream = nullptr) const;
  // The kernel op runs with on the current GPU, named as autotune names it; compiles nothing.
  std::string kernel_name(ConvOp op) const;
  // The kernels op can run with on the current GPU (those autotune times), the running one among them.
  std::vector<std::string> kernel_names(ConvOp op) const;
  // Makes op run with kernel `name` (one of kernel_names(op)) on GPUs of the current one's target,
  // for this object, until autotune chooses again; stores no tuning record. Throws Error otherwise.
  void use_kernel(ConvOp op, const std::string& name) const;
  // The generated CUDA source of the kernels (for inspection): the tensor-core kernels' first where
  // they run, then the direct ones' (l2_normalize).
  std::string generated_source() const;

  std::int64_t input_elements(std::int64_t n) const;   // of fprop's input (deconv: [n, K, M, P, Q])
  std::int64_t output_elements(std::int64_t n) const;  // of fprop's output
  std::int64_t filter_elements() const;
  const ConvLayout& layout() const;
  const ConvGeometry& geometry() const;
  const ConvOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// blocksparse's ConvEdgeBias: a gain and a bias per output channel for the output positions whose
// receptive field reaches padding, one pair per group of such positions that miss the same taps
// (a layer can learn what padding hides from it). Positions inside get neither. For a convolution
// the positions are its output's; with options.deconv, the deconvolution's output's (the
// convolution's input positions). gain and bias are fp32 [edges(), channels] for channels-last
// activations and [channels, edges()] for channels-first ones, as blocksparse shaped them.
class ConvEdgeBias {
 public:
  ConvEdgeBias(const ConvGeometry& geometry, std::int64_t channels, ConvOptions options = {});
  ~ConvEdgeBias();
  ConvEdgeBias(ConvEdgeBias&&) noexcept;
  ConvEdgeBias& operator=(ConvEdgeBias&&) noexcept;

  // y = x · gain + bias at the edge positions, x elsewhere; y may be x.
  void forward(const void* x, const float* gain, const float* bias, void* y, std::int64_t n,
               Stream stream = nullptr) const;
  // dx = dy · gain at the edge positions, dy elsewhere (dx may be dy); grad_gain = Σ dy · x and
  // grad_bias = Σ dy over the images and each group's positions (same shapes as gain and bias).
  void backward(const void* dy, const void* x, const float* gain, void* dx, float* grad_gain, float* grad_bias,
                std::int64_t n, Stream stream = nullptr) const;

  std::int64_t edges() const;      // the groups (0 where padding reaches no output position)
  std::int64_t positions() const;  // output positions an image
  // Per output position (row-major), its group or -1.
  const std::vector<int>& position_edges() const;
  int precompile(const std::string& arch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bsjit
