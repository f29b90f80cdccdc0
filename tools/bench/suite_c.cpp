#include "suite_c.hpp"

#include <cudnn.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "baselines.hpp"
#include "bsjit/bsjit.hpp"
#include "device_buffer.hpp"
#include "op_check.hpp"
#include "suite_layouts.hpp"

// cuDNN's convolution API of descriptors is deprecated in cuDNN 9 in favour of its graph API; it is
// still what PyTorch's convolutions call, and the baseline here.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace bsjit::bench {
namespace {

using tools::DeviceBuffer;

// The cuDNN functions the baseline calls, from libcudnn.so.9 opened at run time.
#define BSJIT_CUDNN_FUNCTIONS(X)                    \
  X(cudnnCreate)                                    \
  X(cudnnDestroy)                                   \
  X(cudnnSetStream)                                 \
  X(cudnnGetErrorString)                            \
  X(cudnnCreateTensorDescriptor)                    \
  X(cudnnSetTensor4dDescriptor)                     \
  X(cudnnDestroyTensorDescriptor)                   \
  X(cudnnCreateFilterDescriptor)                    \
  X(cudnnSetFilter4dDescriptor)                     \
  X(cudnnDestroyFilterDescriptor)                   \
  X(cudnnCreateConvolutionDescriptor)               \
  X(cudnnSetConvolution2dDescriptor)                \
  X(cudnnSetConvolutionGroupCount)                  \
  X(cudnnSetConvolutionMathType)                    \
  X(cudnnDestroyConvolutionDescriptor)              \
  X(cudnnFindConvolutionForwardAlgorithm)           \
  X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnConvolutionForward)                        \
  X(cudnnFindConvolutionBackwardDataAlgorithm)      \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)   \
  X(cudnnConvolutionBackwardData)                   \
  X(cudnnFindConvolutionBackwardFilterAlgorithm)    \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnConvolutionBackwardFilter)

struct Cudnn {
  void* lib = nullptr;
#define BSJIT_CUDNN_FIELD(name) decltype(&::name) name = nullptr;
  BSJIT_CUDNN_FUNCTIONS(BSJIT_CUDNN_FIELD)
#undef BSJIT_CUDNN_FIELD

  // Null (with why) where libcudnn.so.9 or one of its functions is missing.
  static std::unique_ptr<Cudnn> open(std::string* why) {
    auto c = std::make_unique<Cudnn>();
    c->lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
      *why = dlerror();
      return nullptr;
    }
    bool ok = true;
    auto get = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(c->lib, name));
      if (!f) ok = false, *why = std::string("no ") + name;
    };
#define BSJIT_CUDNN_GET(name) get(c->name, #name);
    BSJIT_CUDNN_FUNCTIONS(BSJIT_CUDNN_GET)
#undef BSJIT_CUDNN_GET
    return ok ? std::move(c) : nullptr;
  }
  void check(cudnnStatus_t s, const char* what) const {
    if (s != CUDNN_STATUS_SUCCESS) throw Error(fmt::format("cuDNN {}: {}", what, cudnnGetErrorString(s)));
  }
};

void random_bf16(DeviceBuffer& b, std::uint64_t seed) { b.upload(random_bf16_bits(b.bytes / 2, seed)); }

struct Shape {
  const char* name;
  int hw, c, k, r, stride;
};

const Shape kShapes[] = {{"56x56 3x3 C=K=256", 56, 256, 256, 3, 1},
                         {"28x28 3x3 C=K=512", 28, 512, 512, 3, 1},
                         {"14x14 3x3 C=K=1024", 14, 1024, 1024, 3, 1},
                         {"56x56 3x3 stride 2 C=K=256", 56, 256, 256, 3, 2},
                         {"14x14 1x1 C=1024 K=256", 14, 1024, 256, 1, 1}};

// cuDNN's fastest algorithm for each op of a shape at n images (groups: a grouped convolution),
// timed as bsjit's calls are: {fprop, bprop, updat} in ms, bf16 NHWC with fp32 accumulation on the
// tensor cores.
std::array<double, 3> cudnn_ms(const Cudnn& dnn, const Shape& s, std::int64_t n, int groups, CUstream stream,
                               int reps) {
  cudnnHandle_t h;
  dnn.check(dnn.cudnnCreate(&h), "create");
  dnn.check(dnn.cudnnSetStream(h, reinterpret_cast<cudaStream_t>(stream)), "set stream");
  const int out = (s.hw + 2 * (s.r / 2) - s.r) / s.stride + 1;
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  dnn.check(dnn.cudnnCreateTensorDescriptor(&x), "tensor");
  dnn.check(dnn.cudnnCreateTensorDescriptor(&y), "tensor");
  dnn.check(dnn.cudnnCreateFilterDescriptor(&w), "filter");
  dnn.check(dnn.cudnnCreateConvolutionDescriptor(&conv), "convolution");
  dnn.check(
      dnn.cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, static_cast<int>(n), s.c, s.hw, s.hw),
      "x");
  dnn.check(
      dnn.cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, CUDNN_DATA_BFLOAT16, static_cast<int>(n), s.k, out, out),
      "y");
  dnn.check(dnn.cudnnSetFilter4dDescriptor(w, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, s.k, s.c / groups, s.r, s.r),
            "w");
  dnn.check(dnn.cudnnSetConvolution2dDescriptor(conv, s.r / 2, s.r / 2, s.stride, s.stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "descriptor");
  dnn.check(dnn.cudnnSetConvolutionGroupCount(conv, groups), "groups");
  dnn.check(dnn.cudnnSetConvolutionMathType(conv, CUDNN_TENSOR_OP_MATH), "math");
  DeviceBuffer dx(n * s.c * s.hw * s.hw * 2), dy(n * s.k * out * out * 2),
      dw(static_cast<std::size_t>(s.k) * (s.c / groups) * s.r * s.r * 2);
  random_bf16(dx, 4), random_bf16(dy, 5), random_bf16(dw, 6);  // random inputs, as BENCH.md asks of baselines
  const float one = 1, zero = 0;
  int found = 0;
  std::size_t bytes = 0;
  // the median time of run(workspace) with a workspace of `bytes`
  const auto timed = [&](const std::function<void(void*)>& run) {
    DeviceBuffer ws(std::max<std::size_t>(bytes, 16));
    return time_ms([&] { run(ws.get()); }, stream, 3, reps);
  };
  std::array<double, 3> ms{};
  cudnnConvolutionFwdAlgoPerf_t fwd;
  dnn.check(dnn.cudnnFindConvolutionForwardAlgorithm(h, x, w, conv, y, 1, &found, &fwd), "find forward");
  dnn.check(dnn.cudnnGetConvolutionForwardWorkspaceSize(h, x, w, conv, y, fwd.algo, &bytes), "workspace");
  ms[0] = timed([&](void* ws) {
    dnn.check(
        dnn.cudnnConvolutionForward(h, &one, x, dx.get(), w, dw.get(), conv, fwd.algo, ws, bytes, &zero, y, dy.get()),
        "forward");
  });
  cudnnConvolutionBwdDataAlgoPerf_t data;
  dnn.check(dnn.cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, conv, x, 1, &found, &data), "find data");
  dnn.check(dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(h, w, y, conv, x, data.algo, &bytes), "workspace");
  ms[1] = timed([&](void* ws) {
    dnn.check(dnn.cudnnConvolutionBackwardData(h, &one, w, dw.get(), y, dy.get(), conv, data.algo, ws, bytes, &zero, x,
                                               dx.get()),
              "backward data");
  });
  cudnnConvolutionBwdFilterAlgoPerf_t filter;
  dnn.check(dnn.cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, conv, w, 1, &found, &filter), "find filter");
  dnn.check(dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x, y, conv, w, filter.algo, &bytes), "workspace");
  ms[2] = timed([&](void* ws) {
    dnn.check(dnn.cudnnConvolutionBackwardFilter(h, &one, x, dx.get(), y, dy.get(), conv, filter.algo, ws, bytes, &zero,
                                                 w, dw.get()),
              "backward filter");
  });
  dnn.cudnnDestroyConvolutionDescriptor(conv);
  dnn.cudnnDestroyFilterDescriptor(w);
  dnn.cudnnDestroyTensorDescriptor(x);
  dnn.cudnnDestroyTensorDescriptor(y);
  dnn.cudnnDestroy(h);
  return ms;
}

// A block-diagonal mask of `groups` groups over [rows, cols] blocks (each side divisible by it).
Layout block_diagonal(std::int64_t rows, std::int64_t cols, int groups) {
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  const std::int64_t gr = rows / groups, gc = cols / groups;
  for (int g = 0; g < groups; ++g)
    for (std::int64_t r = 0; r < gr; ++r)
      for (std::int64_t c = 0; c < gc; ++c) coords.push_back({g * gr + r, g * gc + c});
  return Layout::from_coords(rows, cols, coords);
}

}  // namespace

std::vector<ConvRow> run_suite_c(CUstream stream, int reps, double copy_bandwidth, const std::vector<int>& blocks,
                                 const std::vector<double>& densities, const std::string& arch, std::int64_t n) {
  // the cells asked for (an empty list asks for all); every mask is still drawn, so that a cell's
  // layout is the same whichever others run
  const auto chosen = [](const auto& list, auto v) {
    return list.empty() || std::count(list.begin(), list.end(), v) > 0;
  };
  std::string why;
  const auto dnn = Cudnn::open(&why);
  if (!dnn) fmt::print("suite C: cuDNN not loaded ({}): bsjit's times alone\n", why);
  if (n != kSuiteCImages) fmt::print("suite C at N = {} (BENCH.md's is {})\n", n, kSuiteCImages);
  std::vector<ConvRow> rows;
  std::mt19937_64 rng(5600);
  // b = 128 is BENCH.md's suite C's extension, run only when asked for: its masks come from their own
  // generator, so that b = 32 and 64 keep the suite's layouts
  std::mt19937_64 rng128(5628);
  const bool b128 = std::count(blocks.begin(), blocks.end(), 128) > 0;
  for (const Shape& s : kShapes) {
    const std::array<double, 3> dense = dnn ? cudnn_ms(*dnn, s, n, 1, stream, reps) : std::array<double, 3>{};
    const ConvGeometry geometry = ConvGeometry::same({1, s.hw, s.hw}, {1, s.r, s.r}, {1, s.stride, s.stride});
    const std::int64_t out = geometry.out()[2];
    for (int b : {32, 64, 128}) {
      if (b == 128 && !b128) continue;
      std::mt19937_64& draw = b == 128 ? rng128 : rng;
      struct Mask {
        std::string name;
        Layout layout;
        int groups;
        double d;  // balanced masks' density
      };
      std::vector<Mask> masks;
      for (double d : {0.5, 0.25, 0.1})
        masks.push_back({fmt::format("balanced d={}", d), balanced_layout(s.c / b, s.k / b, d, draw), 0, d});
      for (int g : {4, 16})
        if ((s.c / b) % g == 0 && (s.k / b) % g == 0)
          masks.push_back({fmt::format("{} groups", g), block_diagonal(s.c / b, s.k / b, g), g, 0});
      for (const Mask& m : masks) {
        if (!chosen(blocks, b) || (m.groups == 0 && !chosen(densities, m.d))) continue;
        const ConvLayout layout = ConvLayout::from_mask(m.layout, b);
        const Conv conv(layout, geometry, {DType::bf16, ActivationOrder::ndhwc, false, arch});
        conv.load();
        const std::int64_t filter = conv.filter_elements();
        DeviceBuffer x(n * s.c * s.hw * s.hw * 2), y(n * s.k * out * out * 2), f(filter * 2), gx(x.bytes), gf(f.bytes);
        random_bf16(x, 1), random_bf16(y, 2), random_bf16(f, 3);
        const std::array<double, 3> grouped =
            dnn && m.groups ? cudnn_ms(*dnn, s, n, m.groups, stream, reps) : std::array<double, 3>{};
        const double density = static_cast<double>(filter) / (static_cast<double>(s.c) * s.k * s.r * s.r);
        const double flops = 2.0 * static_cast<double>(n) * out * out * static_cast<double>(filter);
        const double bytes = static_cast<double>(x.bytes + y.bytes + f.bytes);
        // the op's correctness on a small image of the same layout (double-precision reference)
        const Conv small(layout, ConvGeometry::same({1, 7, 9}, {1, s.r, s.r}, {1, s.stride, s.stride}),
                         {DType::bf16, ActivationOrder::ndhwc, false, arch});
        const auto s_ = reinterpret_cast<Stream>(stream);
        const std::pair<const char*, std::function<void()>> ops[] = {
            {"fprop", [&] { conv.fprop(x.get(), f.get(), y.get(), n, s_); }},
            {"bprop", [&] { conv.bprop(y.get(), f.get(), gx.get(), n, s_); }},
            {"updat", [&] { conv.updat(x.get(), y.get(), gf.get(), n, s_); }}};
        const check::ConvOp check_ops[] = {check::ConvOp::fprop, check::ConvOp::bprop, check::ConvOp::updat};
        // the ops with the kernels Conv chooses, then each op with the kernel fed by TMA where it has
        // one ("fprop tma", ...; conv_tma.cuh), in the same process
        auto has_tma = [](const Conv& c, ConvOp op) {
          const auto names = c.kernel_names(op);
          return std::find(names.begin(), names.end(), "tma") != names.end();
        };
        std::vector<int> runs{0, 1, 2};  // 3 + op: op on the TMA kernel
        for (int op : {0, 1, 2})
          if (has_tma(conv, static_cast<ConvOp>(op)) && has_tma(small, static_cast<ConvOp>(op))) runs.push_back(3 + op);
        for (int o : runs) {
          const int op = o % 3;
          if (o >= 3) conv.use_kernel(static_cast<ConvOp>(op), "tma"), small.use_kernel(static_cast<ConvOp>(op), "tma");
          ConvRow r{s.name, m.name, o >= 3 ? fmt::format("{} tma", ops[op].first) : ops[op].first, b, density};
          r.ms = time_ms(ops[op].second, stream, 2, reps);
          r.tflops = flops / (r.ms * 1e9);
          r.dense_ms = dense[op];
          r.grouped_ms = grouped[op];
          r.floor_ms = std::max(density * dense[op], bytes / copy_bandwidth * 1e3);
          r.sol = r.floor_ms / r.ms;
          r.error = check::run_and_check(small, check_ops[op], {2, false, false, 9}).relative_error;
          rows.push_back(r);
          fmt::print(
              "{:28} b{:<3} {:16} {}: {:9.3f} ms {:7.1f} TFLOP/s  SOL {:.2f}  cuDNN dense {:.3f} ms{}  error "
              "{:.1e}{}\n",
              r.shape, b, r.mask, r.op, r.ms, r.tflops, r.sol, r.dense_ms,
              r.grouped_ms > 0 ? fmt::format(", grouped {:.3f} ms", r.grouped_ms) : std::string(), r.error,
              r.error <= 1e-2 ? "" : "  WRONG");
        }
      }
    }
  }
  return rows;
}

}  // namespace bsjit::bench
