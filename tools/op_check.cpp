#include "op_check.hpp"

#include <cmath>
#include <cstring>
#include <random>

#include "conv_reference.hpp"
#include "device_buffer.hpp"
#include "reference.hpp"
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit::check {

using tools::DeviceBuffer;

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }
double tolerance(const MatMulOptions& options) { return tolerance(options.tf32 ? DType::bf16 : options.dtype); }

namespace {

std::vector<float> random_gates(std::size_t blocks, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> gate(blocks);
  for (auto& g : gate) g = (rng() % 4 == 0) ? 0.0f : u(rng);
  return gate;
}

// Uploads the op's inputs, poisons its output (or fills it with `before`), runs `call` with the
// call options of o (accumulate, workspace, the gates uploaded) and compares what the output holds
// then with want.
template <class Call>
CheckResult check_on_gpu(DType dt, const std::vector<const std::vector<double>*>& inputs, std::size_t outputs,
                         const std::vector<double>* before, const std::vector<float>& gate,
                         const std::vector<double>& want, const CheckOptions& o, Call call) {
  std::vector<std::unique_ptr<DeviceBuffer>> in;
  for (const auto* v : inputs) {
    in.push_back(std::make_unique<DeviceBuffer>(v->size() * dtype_size(dt)));
    in.back()->upload(reference::encode(dt, *v));
  }
  DeviceBuffer dout(outputs * dtype_size(dt)), dgate(gate.size() * sizeof(float));
  if (before)
    dout.upload(reference::encode(dt, *before));
  else
    BSJIT_CU(runtime::driver().cuMemsetD8(dout.ptr, 0xff, dout.bytes));  // NaN in f32, f16 and bf16
  dgate.upload(gate);
  OpOptions oo;
  oo.accumulate = o.accumulate;
  oo.workspace = o.workspace;
  oo.workspace_bytes = o.workspace_bytes;
  oo.gate = gate.empty() ? nullptr : static_cast<const float*>(dgate.get());
  call(in, dout, oo);
  BSJIT_CU(runtime::driver().cuCtxSynchronize());
  auto got = reference::decode(dt, dout.download());
  CheckResult r;
  r.outputs = static_cast<std::int64_t>(got.size());
  for (double v : got) r.unwritten += std::isnan(v) ? 1 : 0;
  r.relative_error = reference::relative_error(got, want);
  return r;
}

}  // namespace

CheckResult run_and_check(const MatMul& mm, Op op, const CheckOptions& o) {
  const DType dt = mm.options().dtype;
  reference::Problem p{&mm.layout(), mm.options().block, mm.options().feature_axis, o.n};
  reference::Sizes s = reference::sizes(p, op);
  std::mt19937_64 rng(o.seed);
  auto a = reference::random_values(dt, s.a, rng);
  auto b = reference::random_values(dt, s.b, rng);
  std::vector<double> before;
  if (o.accumulate) before = reference::random_values(dt, s.out, rng);
  const std::vector<float> gate = o.gated ? random_gates(mm.layout().blocks(), rng) : std::vector<float>{};
  auto want = reference::matmul(p, op, a, b, o.accumulate ? &before : nullptr, gate);
  return check_on_gpu(dt, {&a, &b}, s.out, o.accumulate ? &before : nullptr, gate, want, o,
                      [&](auto& in, DeviceBuffer& out, const OpOptions& oo) {
                        switch (op) {
                          case Op::forward:
                            mm.forward(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                          case Op::backward_data:
                            mm.backward_data(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                          case Op::backward_weight:
                            mm.backward_weight(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                        }
                      });
}

const char* to_string(ConvOp op) { return op == ConvOp::fprop ? "fprop" : op == ConvOp::bprop ? "bprop" : "updat"; }

CheckResult run_and_check(const Conv& conv, ConvOp op, const CheckOptions& o) {
  const DType dt = conv.options().dtype;
  const bool deconv = conv.options().deconv;
  const ConvLayout& layout = conv.layout();
  const reference::ConvProblem p{&layout, conv.geometry(), o.n, conv.options().order == ActivationOrder::ndhwc};
  const std::int64_t taps = conv.geometry().taps();
  std::mt19937_64 rng(o.seed);
  // in the convolution's terms: its input x, its output y, the filter f
  const auto x = reference::random_values(dt, reference::conv_input_elements(p), rng);
  const auto y = reference::random_values(dt, reference::conv_output_elements(p), rng);
  const auto f = reference::random_values(dt, layout.filter_elements(taps), rng);
  const std::vector<float> gate = o.gated ? random_gates(layout.blocks().size(), rng) : std::vector<float>{};
  auto gated = [&](std::vector<double> filter) {  // each block's filter (or its gradient) times its gate
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const std::int64_t begin = layout.filter_offset(i, taps),
                         size = static_cast<std::int64_t>(layout.blocks()[i].c.size() * layout.blocks()[i].k.size());
      for (std::int64_t e = begin; e < begin + size * taps; ++e) filter[e] *= gate[i];
    }
    return filter;
  };
  // fprop of a convolution and bprop of a deconvolution read x and write y's shape; the other two
  // read y and write x's shape; updat reads both
  const bool x_to_y = (op == ConvOp::fprop) != deconv;
  std::vector<double> want;
  if (op == ConvOp::updat)
    want = gated(reference::conv_updat(p, x, y));
  else
    want = x_to_y ? reference::conv_fprop(p, x, gated(f)) : reference::conv_bprop(p, y, gated(f));
  std::vector<double> before;
  if (o.accumulate) {
    before = reference::random_values(dt, want.size(), rng);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += before[i];
  }
  const std::vector<double>& input = op == ConvOp::updat ? (deconv ? y : x) : (x_to_y ? x : y);
  const std::vector<double>& second = op == ConvOp::updat ? (deconv ? x : y) : f;
  return check_on_gpu(dt, {&input, &second}, want.size(), o.accumulate ? &before : nullptr, gate, want, o,
                      [&](auto& in, DeviceBuffer& out, const OpOptions& oo) {
                        switch (op) {
                          case ConvOp::fprop:
                            conv.fprop(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                          case ConvOp::bprop:
                            conv.bprop(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                          case ConvOp::updat:
                            conv.updat(in[0]->get(), in[1]->get(), out.get(), o.n, nullptr, oo);
                            break;
                        }
                      });
}

}  // namespace bsjit::check
