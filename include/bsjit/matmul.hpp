// Block-sparse matmul for a sparse weight layer: the forward, backward-data and backward-weight
// products, each compiled at first use for this layout, block size, dtype and feature axis.
//
//   bsjit::MatMul mm(bsjit::Layout::from_npy("w_layout.npy"), {.block = 32, .dtype = bsjit::DType::bf16});
//   mm.forward(x, w, y, n, stream);            // Y[N,K]  = X[N,C] · W
//   mm.backward_data(dy, w, dx, n, stream);    // dX[N,C] = dY[N,K] · Wᵀ
//   mm.backward_weight(x, dy, dw, n, stream);  // dW = Xᵀ · dY, nonzero blocks only
//
// Shapes: C = layout.rows() · block, K = layout.cols() · block. W and dW hold the nonzero blocks,
// [layout.blocks(), block, block], in the layout's block order (layout.hpp). X, Y, dX, dY are
// [N, features] with FeatureAxis::last, [features, N] with FeatureAxis::first. All pointers are
// device pointers, 16-byte aligned, in the current CUDA context (device 0's primary context is
// used when the thread has none). Calls are asynchronous on the given stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"

namespace bsjit {

struct MatMulOptions {
  int block = 32;                                // 8, 16, 32, 64 or 128
  DType dtype = DType::f32;                      // of X, W, Y and gradients; accumulation is fp32
  FeatureAxis feature_axis = FeatureAxis::last;  // of X, Y, dX, dY
  std::string arch;                              // "sm_80", "sm_90", "sm_90a"...; empty: the device's
                                                 // (sm_90a on compute capability 9.0)
  // fp32 only, opt-in: multiply on the tensor cores as TF32 (inputs rounded to 10 mantissa bits, as
  // cuBLAS's TF32 GEMM does; fp32 accumulation; relative errors of 2-3e-4 instead of 1e-6). Needs
  // block ≥ 16 and the feature axis last; the default keeps exact fp32.
  bool tf32 = false;
  // SMs the persistent Hopper kernels' schedules are planned for (1-144): 0, the GPU's at run time,
  // and 132 (H100 / H200 SXM) where none is known, as in precompile. Set it to precompile for GPUs of
  // another count (H100 PCIe 114, H20 78): the kernels differ only in their work order, and run
  // correctly on any GPU.
  int sms = 0;
};

// A call with neither option runs the op's plain kernel, one with either its general kernel (Calls).
struct OpOptions {
  bool accumulate = false;      // out += result (beta = 1) instead of out = result
  const float* gate = nullptr;  // device array [layout.blocks()]: W block i scaled by gate[i]; 0 skips it
  // The device workspace of a kernel that needs one (MatMul::workspace_size: backward-weight's split
  // over N, the small batch's split columns, the counters that pace a Hopper kernel's wave), given by the caller
  // instead of the one bsjit keeps per stream: for allocators and CUDA graph capture, where bsjit must not allocate.
  // 16-byte aligned, at least workspace_size bytes, its first workspace_counter_bytes() zero before the call (every
  // call leaves them zero again); one call at a time uses it. Null: bsjit's own. Not a kernel option: it keeps the call
  // plain.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// What MatMul::autotune measured and chose.
struct TuneResult {
  std::string chosen;  // tile shape, e.g. "bm128-bk64-w2x2-s3"
  std::vector<std::pair<std::string, double>> milliseconds;  // every candidate's median time
};

class MatMul {
 public:
  MatMul(Layout layout, MatMulOptions options);
  ~MatMul();
  MatMul(MatMul&&) noexcept;
  MatMul& operator=(MatMul&&) noexcept;

  void forward(const void* x, const void* w, void* y, std::int64_t n, Stream stream = nullptr,
               const OpOptions& op = {}) const;
  void backward_data(const void* dy, const void* w, void* dx, std::int64_t n, Stream stream = nullptr,
                     const OpOptions& op = {}) const;
  // Where the layout's blocks do not fill the GPU, backward_weight splits N across CTAs and adds
  // their fp32 partials in a device workspace. One workspace serves every MatMul launching on the
  // same stream (of the same context): allocated on first use, grown to the largest kernel's need
  // (after that stream's queued work; up to 16.5 MB on the benchmark's shapes), freed with the last
  // MatMul that used it.
  void backward_weight(const void* x, const void* dy, void* dw, std::int64_t n, Stream stream = nullptr,
                       const OpOptions& op = {}) const;

  // Compiles op's kernels for arch into the cache without touching a GPU (build machines): those of
  // the calls named (both batch variants of each). Returns true when any was compiled now, false
  // when the cache already held them all.
  bool precompile(Op op, const std::string& arch, Calls calls = Calls::all) const;
  // The same for several ops, their kernels compiled side by side (one per core). A layer's three
  // products and their small-batch variants are six kernels of 0.1-0.8 s each on Hopper per kind
  // of call (twelve for Calls::all), so this takes about as long as the slowest of them instead of
  // their sum where the cores suffice. Returns true when any was compiled now.
  bool precompile(const std::vector<Op>& ops, const std::string& arch, Calls calls = Calls::all) const;

  // Times every tile shape bsjit can use for op at n rows on the current GPU (on scratch inputs of
  // that size, on stream), keeps the fastest for this layout, block, dtype and feature axis at this
  // batch class (n ≤ 128, or above), and stores the choice in the cache beside the kernels: later
  // calls, and later processes sharing the cache, use it without tuning. Ops whose kernel has a
  // single shape (fp32, feature axis first, block 8) report that shape.
  TuneResult autotune(Op op, std::int64_t n, Stream stream = nullptr) const;

  // Gets op's kernels for the calls named ready in the current context (compiled or loaded from the
  // cache, module loaded), so the first call pays nothing. Throws in strict mode when the cache
  // lacks one.
  void prepare(Op op, Calls calls = Calls::all) const;
  // The same for several ops, compiling the kernels the cache lacks side by side (as precompile
  // does): mm.prepare({Op::forward, Op::backward_data, Op::backward_weight}) before a training
  // step's first call.
  void prepare(const std::vector<Op>& ops, Calls calls = Calls::all) const;

  // The generated CUDA source of the kernel that runs op's calls with these options (for
  // inspection and debugging).
  std::string generated_source(Op op, const OpOptions& call = {}) const;

  // The name of the kernel that runs op at n rows with these options on the current GPU, with its
  // tile shape where it has one ("forward-bf16-b64-last-tma2-bm256-s4-plain"), tuned or the
  // default; compiles nothing.
  std::string kernel_label(Op op, std::int64_t n, const OpOptions& call = {}) const;

  // Bytes of the workspace the kernel of op's calls with these options takes at n rows on the
  // current GPU (0: none); compiles or loads the kernel like a first call. Pass a workspace of this
  // size in OpOptions to launch without bsjit allocating.
  std::size_t workspace_size(Op op, std::int64_t n, const OpOptions& call = {}) const;
  // The bytes at the start of a workspace that must be zero before its first use.
  static std::size_t workspace_counter_bytes();

  const Layout& layout() const;
  const MatMulOptions& options() const;
  std::int64_t in_features() const;   // C
  std::int64_t out_features() const;  // K
  std::int64_t weight_elements() const;  // blocks · block²

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bsjit
