// GPU tests (ctest label "gpu") of bsjit::Conv against the double-precision reference
// (tools/conv_reference, through tools/op_check): blocksparse's conv cases (tests/conv_cases.hpp) in
// every dtype and both activation orders, as a convolution and as a deconvolution, fprop, bprop and
// updat, plain, gated and accumulating; outputs poisoned with NaN before each call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <utility>

#include "bsjit/bsjit.hpp"
#include "conv_cases.hpp"
#include "op_check.hpp"
#include "runtime/driver.hpp"

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

TEST_P(ConvGpu, EveryCaseMatchesTheReference) {
  const Param prm = GetParam();
  for (const auto& c : testing::conv_cases()) {
    const Conv conv(c.layout, c.geometry, {prm.dtype, prm.order, prm.deconv, ""});
    for (check::ConvOp op : {check::ConvOp::fprop, check::ConvOp::bprop, check::ConvOp::updat})
      for (const auto& [gated, accumulate] : {std::pair{false, false}, {true, false}, {false, true}}) {
        SCOPED_TRACE(fmt::format("{}: {}{}{}", c.name, check::to_string(op), gated ? ", gated" : "",
                                 accumulate ? ", accumulating" : ""));
        const auto r = check::run_and_check(conv, op, {c.n, accumulate, gated, 5601});
        EXPECT_LE(r.relative_error, check::tolerance(prm.dtype));
        EXPECT_EQ(r.unwritten, 0);
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
