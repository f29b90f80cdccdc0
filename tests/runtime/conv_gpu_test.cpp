// GPU tests (ctest label "gpu") of bsjit::Conv against the double-precision reference
// (tools/conv_reference, through tools/op_check): blocksparse's conv cases (tests/conv_cases.hpp) in
// every dtype and both activation orders, as a convolution and as a deconvolution, fprop, bprop and
// updat, plain, gated and accumulating, and the uniform layouts of the tensor-core kernels; outputs
// poisoned with NaN before each call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>

#include "bsjit/bsjit.hpp"
#include "conv_cases.hpp"
#include "conv_reference.hpp"
#include "device_buffer.hpp"
#include "op_check.hpp"
#include "reference.hpp"
#include "runtime/attention_common.hpp"
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

struct Param {
  DType dtype;
  ActivationOrder order;
  bool deconv;
};

class ConvGpu : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    set_cache_directory({});
  }
};

// Every op of every case, plain, gated and accumulating, against the reference; kernels built for
// arch ("": the GPU's).
void check_cases(const Param& prm, const std::vector<testing::ConvCase>& cases, std::uint64_t seed,
                 const std::string& arch = "") {
  for (const auto& c : cases) {
    const Conv conv(c.layout, c.geometry, {prm.dtype, prm.order, prm.deconv, arch});
    for (check::ConvOp op : {check::ConvOp::fprop, check::ConvOp::bprop, check::ConvOp::updat})
      for (const auto& [gated, accumulate] : {std::pair{false, false}, {true, false}, {false, true}}) {
        SCOPED_TRACE(fmt::format("{}: {}{}{}", c.name, check::to_string(op), gated ? ", gated" : "",
                                 accumulate ? ", accumulating" : ""));
        const auto r = check::run_and_check(conv, op, {c.n, accumulate, gated, seed});
        EXPECT_LE(r.relative_error, check::tolerance(prm.dtype));
        EXPECT_EQ(r.unwritten, 0);
      }
  }
}

TEST_P(ConvGpu, EveryCaseMatchesTheReference) { check_cases(GetParam(), testing::conv_cases(), 5601); }

// The uniform layouts of the tensor-core kernels (16-bit, channels last; the direct ones otherwise)
// against the reference.
TEST_P(ConvGpu, TensorCoreCasesMatchTheReference) { check_cases(GetParam(), testing::tensor_core_conv_cases(), 5606); }

// On sm_90a the data kernels of b = 64 and 128 run on the warpgroup tensor cores (conv_wgmma.cuh);
// built for sm_90 the same cases take the mma.sync kernels, which the other GPUs run.
TEST_P(ConvGpu, TensorCoreCasesMatchTheReferenceOnMmaSync) {
  const std::string arch = runtime::kernel_arch("", runtime::current_context());
  if (arch != "sm_90a") GTEST_SKIP() << "the mma.sync kernels are what " << arch << " runs";
  check_cases(GetParam(), testing::tensor_core_conv_cases(), 5607, "sm_90");
}

// The kernels fed by TMA in im2col mode (conv_tma.cuh; sm_90a, b = 64 and 128), chosen by
// use_kernel: fprop, updat, and bprop at stride 1 (the transposed convolution), on the tensor-core cases
// they take and on 2-D ones whose tiles cross rows and images, with strides, dilations, odd sizes
// and a filter wider than high (the map's W and H apart), plain, gated and accumulating; as a
// deconvolution each runs the other op.
TEST_P(ConvGpu, TmaKernelsMatchTheReference) {
  const Param prm = GetParam();
  if (prm.dtype == DType::f32 || prm.order != ActivationOrder::ndhwc) GTEST_SKIP() << "the tensor-core cases' kernels";
  const std::string arch = runtime::kernel_arch("", runtime::current_context());
  if (arch != "sm_90a") GTEST_SKIP() << "conv_tma.cuh is sm_90a's";
  auto cases = testing::tensor_core_conv_cases();
  const Layout three = Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}, {1, 2}});
  const Layout lower = Layout::from_coords(2, 2, {{0, 0}, {1, 0}, {1, 1}});
  cases.push_back(
      {"tma b64 3x3 SAME, 3 images", ConvLayout::from_mask(three, 64), ConvGeometry::same({1, 13, 15}, {1, 3, 3}), 3});
  cases.push_back({"tma b128 3x3 SAME stride 2 odd sizes", ConvLayout::from_mask(lower, 128),
                   ConvGeometry::same({1, 9, 11}, {1, 3, 3}, {1, 2, 2}), 2});
  cases.push_back({"tma b64 5x5 VALID dilation 2", ConvLayout::from_mask(lower, 64),
                   ConvGeometry::valid({1, 12, 14}, {1, 5, 5}, {1, 1, 1}, {1, 2, 2}), 2});
  cases.push_back({"tma b64 1x7 SAME stride 1x2", ConvLayout::from_mask(three, 64),
                   ConvGeometry::same({1, 5, 20}, {1, 1, 7}, {1, 1, 2}), 2});
  cases.push_back({"tma b128 1x4 SAME (uneven padding)", ConvLayout::from_mask(lower, 128),
                   ConvGeometry::same({1, 6, 21}, {1, 1, 4}), 2});
  int ran[3] = {0, 0, 0};  // per ConvOp
  std::uint64_t seed = 5620;
  for (const auto& c : cases) {
    const Conv conv(c.layout, c.geometry, {prm.dtype, prm.order, prm.deconv, ""});
    for (const auto& [op, checked] : {std::pair{ConvOp::fprop, check::ConvOp::fprop},
                                      {ConvOp::bprop, check::ConvOp::bprop},
                                      {ConvOp::updat, check::ConvOp::updat}}) {
      const auto names = conv.kernel_names(op);
      if (std::find(names.begin(), names.end(), "tma") == names.end()) continue;
      conv.use_kernel(op, "tma");
      ASSERT_EQ(conv.kernel_name(op), "tma");
      ++ran[static_cast<int>(op)];
      for (const auto& [gated, accumulate] : {std::pair{false, false}, {true, false}, {false, true}}) {
        SCOPED_TRACE(fmt::format("{}: {}{}{}", c.name, check::to_string(checked), gated ? ", gated" : "",
                                 accumulate ? ", accumulating" : ""));
        const auto r = check::run_and_check(conv, checked, {c.n, accumulate, gated, seed++});
        EXPECT_LE(r.relative_error, check::tolerance(prm.dtype));
        EXPECT_EQ(r.unwritten, 0);
      }
    }
  }
  // the op that runs the forward kernel: three of the tensor-core cases and the five above; the
  // transposed one at stride 1: two tensor-core cases and three above
  EXPECT_GE(ran[prm.deconv ? 1 : 0], 8);
  EXPECT_GE(ran[prm.deconv ? 0 : 1], 5);
  EXPECT_GE(ran[2], 8);  // updat: the forward geometry's
}

// Without a tuning record, fprop and bprop run the kernel fed by TMA where it applies, updat the
// warpgroup kernel at b = 64 (the TMA updat ran 0.53-0.72× its speed on suite C) and the TMA one at
// b = 128 (1.07-1.22× the warpgroup updat's speed).
TEST(ConvGpuKernels, DefaultKernels) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (int b : {64, 128}) {
    // a geometry no other test tunes or pins, so that no tuning record of theirs applies
    const Conv conv(ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 1}}), b),
                    ConvGeometry::same({1, 10, 6}, {1, 3, 3}), {DType::bf16, ActivationOrder::ndhwc, false, ""});
    const auto names = conv.kernel_names(ConvOp::updat);
    if (std::find(names.begin(), names.end(), "tma") == names.end()) GTEST_SKIP() << "no TMA kernels on this GPU";
    EXPECT_EQ(conv.kernel_name(ConvOp::fprop), "tma") << b;
    EXPECT_EQ(conv.kernel_name(ConvOp::bprop), "tma") << b;
    EXPECT_EQ(conv.kernel_name(ConvOp::updat), b == 64 ? "wgmma" : "tma") << b;
  }
}

// use_kernel takes the names kernel_names lists and nothing else.
TEST(ConvGpuKernels, UseKernelTakesOnlyListedNames) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Conv conv(ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 1}}), 64),
                  ConvGeometry::same({1, 8, 8}, {1, 3, 3}), {DType::bf16, ActivationOrder::ndhwc, false, ""});
  for (ConvOp op : {ConvOp::fprop, ConvOp::bprop, ConvOp::updat}) {
    const auto names = conv.kernel_names(op);
    ASSERT_FALSE(names.empty());
    for (const auto& name : names) {
      conv.use_kernel(op, name);
      EXPECT_EQ(conv.kernel_name(op), name);
    }
    EXPECT_THROW(conv.use_kernel(op, "cutlass"), Error);
  }
}

// A workspace the caller gives (OpOptions::workspace, Conv::workspace_size) serves every op of the
// tensor-core cases and of a 1×1 convolution that runs as a matmul (its matmul's workspace first),
// plain, gated and accumulating.
TEST(ConvGpuWorkspace, CallerWorkspaceServesEveryOp) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto cases = testing::tensor_core_conv_cases();
  for (const auto& c : testing::conv_cases())
    if (std::string(c.name).find("a matmul") != std::string::npos) cases.push_back(c);
  tools::DeviceBuffer flag(16);  // a gate pointer for the sizes of gated calls (not read)
  std::uint64_t seed = 5700;
  for (const auto& c : cases) {
    const Conv conv(c.layout, c.geometry, {DType::bf16, ActivationOrder::ndhwc, false, ""});
    for (check::ConvOp op : {check::ConvOp::fprop, check::ConvOp::bprop, check::ConvOp::updat})
      for (const auto& [gated, accumulate] : {std::pair{false, false}, {true, false}, {false, true}}) {
        SCOPED_TRACE(fmt::format("{}: {}{}{}", c.name, check::to_string(op), gated ? ", gated" : "",
                                 accumulate ? ", accumulating" : ""));
        OpOptions call;
        call.accumulate = accumulate;
        call.gate = gated ? static_cast<const float*>(flag.get()) : nullptr;
        const ConvOp api = op == check::ConvOp::fprop   ? ConvOp::fprop
                           : op == check::ConvOp::bprop ? ConvOp::bprop
                                                        : ConvOp::updat;
        const std::size_t bytes = std::max<std::size_t>(conv.workspace_size(api, c.n, call), 16);
        runtime::DeviceMemory memory(bytes);
        BSJIT_CU(runtime::driver().cuMemsetD8(memory.ptr, 0, std::min(bytes, MatMul::workspace_counter_bytes())));
        const auto r = check::run_and_check(conv, op, {c.n, accumulate, gated, seed++, memory.get(), bytes});
        EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
        EXPECT_EQ(r.unwritten, 0);
      }
  }
}

// autotune times every kernel an op has (kernel_names: on sm_90a at b ≥ 64 the warpgroup and
// mma.sync ones, fprop's TMA one too where it applies; one otherwise), keeps the fastest, names it
// as kernel_name does, and a second Conv of the same layout and geometry finds the choice; the
// convolution stays correct with it.
TEST_P(ConvGpu, AutotuneKeepsTheFasterKernel) {
  const Param prm = GetParam();
  if (prm.dtype == DType::f32 || prm.order != ActivationOrder::ndhwc) GTEST_SKIP() << "the tensor-core cases' kernels";
  const std::pair<ConvOp, check::ConvOp> ops[] = {{ConvOp::fprop, check::ConvOp::fprop},
                                                  {ConvOp::bprop, check::ConvOp::bprop},
                                                  {ConvOp::updat, check::ConvOp::updat}};
  for (const auto& c : testing::tensor_core_conv_cases()) {
    const ConvOptions options{prm.dtype, prm.order, prm.deconv, ""};
    const Conv conv(c.layout, c.geometry, options);
    for (const auto& [op, checked] : ops) {
      SCOPED_TRACE(fmt::format("{}: {}", c.name, check::to_string(checked)));
      const auto names = conv.kernel_names(op);
      const TuneResult r = conv.autotune(op, c.n);
      ASSERT_EQ(r.milliseconds.size(), names.size());
      double best = r.milliseconds[0].second;
      for (const auto& [name, ms] : r.milliseconds) {
        EXPECT_GT(ms, 0.0) << name;
        best = std::min(best, ms);
      }
      const auto chosen = std::find_if(r.milliseconds.begin(), r.milliseconds.end(),
                                       [&](const auto& m) { return m.first == r.chosen; });
      ASSERT_NE(chosen, r.milliseconds.end()) << r.chosen;
      EXPECT_EQ(chosen->second, best);
      EXPECT_EQ(conv.kernel_name(op), r.chosen);
      EXPECT_EQ(Conv(c.layout, c.geometry, options).kernel_name(op), r.chosen);
      const auto result = check::run_and_check(conv, checked, {c.n, false, true, 5608});
      EXPECT_LE(result.relative_error, check::tolerance(prm.dtype));
      EXPECT_EQ(result.unwritten, 0);
    }
  }
}

// l2_normalize and its gradient against tools/conv_reference, with and without a gain, in place too.
TEST_P(ConvGpu, L2NormalizeMatchesTheReference) {
  const Param prm = GetParam();
  const DType dt = prm.dtype;
  std::mt19937_64 rng(5602);
  for (const auto& c : testing::conv_cases()) {
    SCOPED_TRACE(c.name);
    const Conv conv(c.layout, c.geometry, {dt, prm.order, prm.deconv, ""});
    const std::int64_t taps = c.geometry.taps(), rows = conv.normalized_rows();
    const auto f = reference::random_values(dt, conv.filter_elements(), rng);
    const auto u = reference::random_values(dt, f.size(), rng);
    std::vector<double> gain(rows);
    for (std::int64_t i = 0; i < rows; ++i) gain[i] = 0.5 + static_cast<double>(i % 7) * 0.25;
    const std::size_t bytes = f.size() * dtype_size(dt);
    tools::DeviceBuffer df(bytes), du(bytes), out(bytes), sums(rows * 4), dgain(rows * 4), grad_gain(rows * 4);
    df.upload(reference::encode(dt, f));
    du.upload(reference::encode(dt, u));
    dgain.upload(std::vector<float>(gain.begin(), gain.end()));
    auto floats = [](const tools::DeviceBuffer& b) {
      const auto v = b.download<float>();
      return std::vector<double>(v.begin(), v.end());
    };
    for (const bool gained : {false, true}) {
      SCOPED_TRACE(gained ? "gain" : "no gain");
      const float* g = gained ? static_cast<const float*>(dgain.get()) : nullptr;
      const std::vector<double> gv = gained ? gain : std::vector<double>{};
      BSJIT_CU(runtime::driver().cuMemsetD8(out.ptr, 0xff, bytes));
      conv.l2_normalize(df.get(), g, out.get(), static_cast<float*>(sums.get()));
      conv.l2_normalize_backward(du.get(), df.get(), g, static_cast<const float*>(sums.get()), du.get(),
                                 gained ? static_cast<float*>(grad_gain.get()) : nullptr);  // in place
      BSJIT_CU(runtime::driver().cuCtxSynchronize());
      const double tolerance = check::tolerance(dt);
      EXPECT_LE(reference::relative_error(reference::decode(dt, out.download()),
                                          reference::conv_l2_normalize(c.layout, taps, prm.deconv, f, gv)),
                tolerance);
      const auto [want_grad, want_gain] = reference::conv_l2_normalize_grad(c.layout, taps, prm.deconv, f, gv, u);
      EXPECT_LE(reference::relative_error(reference::decode(dt, du.download()), want_grad), tolerance);
      if (gained) {
        EXPECT_LE(reference::relative_error(floats(grad_gain), want_gain), tolerance);
      }
      du.upload(reference::encode(dt, u));
    }
  }
}

// ConvEdgeBias forward (in place) and backward against its definition on the groups it reports.
TEST_P(ConvGpu, EdgeBiasMatchesItsDefinition) {
  const Param prm = GetParam();
  const DType dt = prm.dtype;
  const bool last = prm.order == ActivationOrder::ndhwc;
  const ConvEdgeBias eb(ConvGeometry::same({2, 6, 7}, {3, 3, 3}, {1, 2, 2}), 6, {dt, prm.order, prm.deconv, ""});
  const std::int64_t n = 2, c = 6, positions = eb.positions(), edges = eb.edges();
  ASSERT_GT(edges, 0);
  std::mt19937_64 rng(5605);
  const auto x = reference::random_values(dt, n * c * positions, rng), dy = reference::random_values(dt, x.size(), rng);
  std::vector<float> gain(edges * c), bias(gain.size());
  for (std::size_t i = 0; i < gain.size(); ++i)
    gain[i] = 0.75f + 0.05f * static_cast<float>(i % 11), bias[i] = 0.02f * i;
  std::vector<double> want_y(x.size()), want_dx(x.size()), want_gain(gain.size()), want_bias(gain.size());
  for (std::int64_t image = 0; image < n; ++image)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t p = 0; p < positions; ++p) {
        const std::int64_t i = last ? (image * positions + p) * c + ch : (image * c + ch) * positions + p;
        const int e = eb.position_edges()[p];
        const std::int64_t at = last ? e * c + ch : ch * edges + e;
        want_y[i] = e < 0 ? x[i] : x[i] * gain[at] + bias[at];
        want_dx[i] = e < 0 ? dy[i] : dy[i] * gain[at];
        if (e >= 0) want_gain[at] += dy[i] * x[i], want_bias[at] += dy[i];
      }
  const std::size_t bytes = x.size() * dtype_size(dt);
  tools::DeviceBuffer dx_(bytes), ddy(bytes), dgain(gain.size() * 4), dbias(gain.size() * 4), gg(gain.size() * 4),
      gb(gain.size() * 4), dxo(bytes);
  dx_.upload(reference::encode(dt, x));
  ddy.upload(reference::encode(dt, dy));
  dgain.upload(gain);
  dbias.upload(bias);
  BSJIT_CU(runtime::driver().cuMemsetD8(dxo.ptr, 0xff, bytes));
  eb.backward(ddy.get(), dx_.get(), static_cast<const float*>(dgain.get()), dxo.get(), static_cast<float*>(gg.get()),
              static_cast<float*>(gb.get()), n);
  eb.forward(dx_.get(), static_cast<const float*>(dgain.get()), static_cast<const float*>(dbias.get()), dx_.get(), n);
  BSJIT_CU(runtime::driver().cuCtxSynchronize());
  const double tolerance = check::tolerance(dt);
  auto floats = [](const tools::DeviceBuffer& b) {
    const auto v = b.download<float>();
    return std::vector<double>(v.begin(), v.end());
  };
  EXPECT_LE(reference::relative_error(reference::decode(dt, dx_.download()), want_y), tolerance);
  EXPECT_LE(reference::relative_error(reference::decode(dt, dxo.download()), want_dx), tolerance);
  EXPECT_LE(reference::relative_error(floats(gg), want_gain), tolerance);
  EXPECT_LE(reference::relative_error(floats(gb), want_bias), tolerance);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (ActivationOrder order : {ActivationOrder::ncdhw, ActivationOrder::ndhwc})
      for (bool deconv : {false, true}) out.push_back({dt, order, deconv});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, ConvGpu, ::testing::ValuesIn(params()), [](const auto& info) {
  return fmt::format("{}_{}{}", to_string(info.param.dtype), to_string(info.param.order),
                     info.param.deconv ? "_deconv" : "");
});

}  // namespace
}  // namespace bsjit
