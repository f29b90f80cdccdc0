// GPU tests (ctest label "gpu") of bsjit::Conv against the double-precision reference
// (tools/conv_reference): blocksparse's conv cases (tests/conv_cases.hpp) in every dtype and both
// activation orders, as a convolution and as a deconvolution, fprop, bprop and updat, plain, gated
// and accumulating; outputs poisoned with NaN before each call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "bsjit/bsjit.hpp"
#include "conv_cases.hpp"
#include "conv_reference.hpp"
#include "device_buffer.hpp"
#include "reference.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

using reference::ConvProblem;

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

std::vector<double> scaled_blocks(const ConvLayout& l, std::int64_t taps, std::vector<double> filter,
                                  const std::vector<float>& gate) {
  for (std::size_t i = 0; i < l.blocks().size(); ++i) {
    const std::int64_t begin = l.filter_offset(i, taps),
                       end = begin + static_cast<std::int64_t>(l.blocks()[i].c.size() * l.blocks()[i].k.size()) * taps;
    for (std::int64_t e = begin; e < end; ++e) filter[e] *= gate[i];
  }
  return filter;
}

TEST_P(ConvGpu, EveryCaseMatchesTheReference) {
  const Param prm = GetParam();
  const DType dt = prm.dtype;
  const std::size_t es = dtype_size(dt);
  const double tolerance = dt == DType::f32 ? 1e-5 : 1e-2;
  std::mt19937_64 rng(5601 + static_cast<int>(dt) * 4 + static_cast<int>(prm.order) * 2 + prm.deconv);
  for (const auto& c : testing::conv_cases()) {
    SCOPED_TRACE(c.name);
    const Conv conv(c.layout, c.geometry, {dt, prm.order, prm.deconv, ""});
    const ConvProblem p{&c.layout, c.geometry, c.n, prm.order == ActivationOrder::ndhwc};
    const std::int64_t taps = c.geometry.taps();
    // the convolution's input x and output y; a deconvolution reads y's shape and writes x's
    const auto x = reference::random_values(dt, reference::conv_input_elements(p), rng);
    const auto y = reference::random_values(dt, reference::conv_output_elements(p), rng);
    const auto f = reference::random_values(dt, c.layout.filter_elements(taps), rng);
    ASSERT_EQ(conv.input_elements(c.n), static_cast<std::int64_t>(prm.deconv ? y.size() : x.size()));
    ASSERT_EQ(conv.filter_elements(), static_cast<std::int64_t>(f.size()));
    auto upload = [&](const std::vector<double>& v) {
      auto b = std::make_unique<tools::DeviceBuffer>(v.size() * es);
      b->upload(reference::encode(dt, v));
      return b;
    };
    auto poisoned = [&](std::size_t count) {
      auto b = std::make_unique<tools::DeviceBuffer>(count * es);
      BSJIT_CU(runtime::driver().cuMemsetD8(b->ptr, 0xff, count * es));
      return b;
    };
    auto result = [&](const tools::DeviceBuffer& b) { return reference::decode(dt, b.download()); };
    const auto dx = upload(x), dy = upload(y), df = upload(f);
    std::vector<float> gate(c.layout.blocks().size());
    for (std::size_t i = 0; i < gate.size(); ++i)
      gate[i] = i % 3 == 1 ? 0.0f : 0.5f + 0.25f * static_cast<float>(i % 4);
    tools::DeviceBuffer dgate(gate.size() * sizeof(float));
    dgate.upload(gate);

    for (const bool gated : {false, true}) {
      SCOPED_TRACE(gated ? "gated" : "plain");
      OpOptions op;
      op.gate = gated ? static_cast<const float*>(dgate.get()) : nullptr;
      const auto fr = gated ? scaled_blocks(c.layout, taps, f, gate) : f;
      const auto want_y = reference::conv_fprop(p, x, fr), want_x = reference::conv_bprop(p, y, fr);
      // conv: fprop x → y, bprop y → x; deconv: fprop y → x, bprop x → y
      const auto& fwd_in = prm.deconv ? *dy : *dx;
      const auto& bwd_in = prm.deconv ? *dx : *dy;
      const auto& fwd_want = prm.deconv ? want_x : want_y;
      const auto& bwd_want = prm.deconv ? want_y : want_x;

      auto out = poisoned(fwd_want.size());
      conv.fprop(fwd_in.get(), df->get(), out->get(), c.n, nullptr, op);
      BSJIT_CU(runtime::driver().cuCtxSynchronize());
      EXPECT_LE(reference::relative_error(result(*out), fwd_want), tolerance) << "fprop";
      if (!gated) {  // accumulate: added to what the output holds
        OpOptions acc;
        acc.accumulate = true;
        conv.fprop(fwd_in.get(), df->get(), out->get(), c.n, nullptr, acc);
        BSJIT_CU(runtime::driver().cuCtxSynchronize());
        auto twice = fwd_want;
        for (auto& v : twice) v *= 2;
        EXPECT_LE(reference::relative_error(result(*out), twice), tolerance) << "fprop accumulate";
      }

      auto grad_in = poisoned(bwd_want.size());
      conv.bprop(bwd_in.get(), df->get(), grad_in->get(), c.n, nullptr, op);
      BSJIT_CU(runtime::driver().cuCtxSynchronize());
      EXPECT_LE(reference::relative_error(result(*grad_in), bwd_want), tolerance) << "bprop";

      // updat(input, grad_output): the convolution's dF from x and dy; the deconvolution's from
      // its input (y's shape) and its output's gradient (x's shape)
      auto grad_f = poisoned(f.size());
      if (prm.deconv)
        conv.updat(dy->get(), dx->get(), grad_f->get(), c.n, nullptr, op);
      else
        conv.updat(dx->get(), dy->get(), grad_f->get(), c.n, nullptr, op);
      BSJIT_CU(runtime::driver().cuCtxSynchronize());
      auto want_f = reference::conv_updat(p, x, y);
      if (gated) want_f = scaled_blocks(c.layout, taps, want_f, gate);
      EXPECT_LE(reference::relative_error(result(*grad_f), want_f), tolerance) << "updat";
    }
  }
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
