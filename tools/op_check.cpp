#include "op_check.hpp"

#include <cmath>
#include <cstring>
#include <random>

#include "device_buffer.hpp"
#include "reference.hpp"
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit::check {

using tools::DeviceBuffer;

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }
double tolerance(const MatMulOptions& options) { return tolerance(options.tf32 ? DType::bf16 : options.dtype); }

CheckResult run_and_check(const MatMul& mm, Op op, const CheckOptions& o) {
  const DType dt = mm.options().dtype;
  reference::Problem p{&mm.layout(), mm.options().block, mm.options().feature_axis, o.n};
  reference::Sizes s = reference::sizes(p, op);
  std::mt19937_64 rng(o.seed);
  auto a = reference::random_values(dt, s.a, rng);
  auto b = reference::random_values(dt, s.b, rng);
  std::vector<double> before;
  if (o.accumulate) before = reference::random_values(dt, s.out, rng);
  std::vector<float> gate;
  if (o.gated) {
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    gate.resize(mm.layout().blocks());
    for (auto& g : gate) g = (rng() % 4 == 0) ? 0.0f : u(rng);
  }

  DeviceBuffer da(s.a * dtype_size(dt)), db(s.b * dtype_size(dt)), dout(s.out * dtype_size(dt));
  DeviceBuffer dgate(gate.size() * sizeof(float));
  da.upload(reference::encode(dt, a));
  db.upload(reference::encode(dt, b));
  if (o.accumulate) dout.upload(reference::encode(dt, before));
  else BSJIT_CU(runtime::driver().cuMemsetD8(dout.ptr, 0xff, dout.bytes));  // NaN in f32, f16 and bf16
  if (o.gated) {
    std::vector<std::uint8_t> gb(gate.size() * sizeof(float));
    std::memcpy(gb.data(), gate.data(), gb.size());
    dgate.upload(gb);
  }

  OpOptions oo;
  oo.accumulate = o.accumulate;
  oo.workspace = o.workspace;
  oo.workspace_bytes = o.workspace_bytes;
  oo.gate = o.gated ? static_cast<const float*>(dgate.get()) : nullptr;
  switch (op) {
    case Op::forward: mm.forward(da.get(), db.get(), dout.get(), o.n, nullptr, oo); break;
    case Op::backward_data: mm.backward_data(da.get(), db.get(), dout.get(), o.n, nullptr, oo); break;
    case Op::backward_weight: mm.backward_weight(da.get(), db.get(), dout.get(), o.n, nullptr, oo); break;
  }
  BSJIT_CU(runtime::driver().cuCtxSynchronize());
  auto got = reference::decode(dt, dout.download());
  auto want = reference::matmul(p, op, a, b, o.accumulate ? &before : nullptr, gate);

  CheckResult r;
  r.outputs = static_cast<std::int64_t>(got.size());
  for (double v : got) r.unwritten += std::isnan(v) ? 1 : 0;
  r.relative_error = reference::relative_error(got, want);
  return r;
}

}  // namespace bsjit::check
