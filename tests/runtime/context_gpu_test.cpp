// GPU tests: bsjit's loaded kernels and device memory across a reset of the context they were made
// in. cudaDeviceReset and cuDevicePrimaryCtxReset destroy the primary context; its next use makes
// it again under the same handle, with a new id. Everything bsjit keeps per context (MatMul's and
// Attention's functions, the shared kernels, the split workspaces, occupancy) must then be made
// afresh in the new context, and nothing of the old one freed or unloaded there. Skipped without a
// GPU.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "bsjit/bsjit.hpp"
#include "device_buffer.hpp"
#include "op_check.hpp"
#include "reference.hpp"
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

// Destroys the current primary context and makes it current again (what the CUDA runtime does on
// its first call after cudaDeviceReset). Returns the context before and after.
std::pair<runtime::Context, runtime::Context> reset_primary_context() {
  const auto& d = runtime::driver();
  const runtime::Context before = runtime::current_context();
  CUdevice dev;
  BSJIT_CU(d.cuCtxGetDevice(&dev));
  BSJIT_CU(d.cuDevicePrimaryCtxReset(dev));
  CUcontext ctx = nullptr;
  BSJIT_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
  BSJIT_CU(d.cuCtxSetCurrent(ctx));
  return {before, runtime::current_context()};
}

class ContextGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_F(ContextGpu, MatMulRunsAgainAfterThePrimaryContextIsReset) {
  // b = 32 bf16: the Hopper TMA or grouped kernels on an H200 (persistent: occupancy cached per
  // context), the mma.sync ones elsewhere; backward-weight at this N may use the split workspace.
  std::vector<std::uint8_t> mask(16 * 16);
  std::mt19937 rng(7);
  for (auto& m : mask) m = rng() % 4 == 0;
  const Layout layout = Layout::from_dense(16, 16, mask);
  const MatMul mm(layout, {32, DType::bf16, FeatureAxis::last, ""});
  const double tol = check::tolerance(DType::bf16);
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
    const auto r = check::run_and_check(mm, op, {1000, false, false, 1});
    ASSERT_LT(r.relative_error, tol) << to_string(op) << " before the reset";
  }
  const auto [before, after] = reset_primary_context();
  EXPECT_NE(before.id, after.id) << "a reset context must not keep its id";
  std::printf("GPU context: handle %s across the reset, id %llu -> %llu\n",
              before.handle == after.handle ? "kept" : "changed", before.id, after.id);
  EXPECT_FALSE(runtime::alive(before));
  EXPECT_TRUE(runtime::alive(after));
  // Before bsjit keyed its maps by the context's id, these launched the old context's functions
  // (the handle is the same): CUDA_ERROR_INVALID_HANDLE, or worse.
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (std::uint64_t seed : {2, 3}) {
      const auto r = check::run_and_check(mm, op, {1000, seed == 3, false, seed});
      EXPECT_LT(r.relative_error, tol) << to_string(op) << " after the reset, seed " << seed;
      EXPECT_EQ(r.unwritten, 0) << to_string(op) << " after the reset";
    }
  // A MatMul made after the reset, of the same layout, shares the registry's compiled kernels.
  const MatMul again(layout, {32, DType::bf16, FeatureAxis::last, ""});
  const auto r = check::run_and_check(again, Op::forward, {64, false, false, 4});
  EXPECT_LT(r.relative_error, tol);
}

TEST_F(ContextGpu, AttentionRunsAgainAfterThePrimaryContextIsReset) {
  // The same inputs before and after the reset give the same bits (the forward is deterministic);
  // the output is poisoned before each run. Its correctness is attention_gpu_test's.
  constexpr std::int64_t kBatch = 1, kHeads = 2, kSeq = 512, kDim = 64;
  const Attention attn({layouts::causal(kSeq / 64)}, {64, kDim, DType::bf16, QkvOrder::bshd, true, ""});
  const std::size_t elems = kBatch * kSeq * kHeads * kDim, bytes = elems * 2, lse_bytes = kBatch * kHeads * kSeq * 4;
  std::mt19937_64 rng(1);
  const auto q = reference::encode(DType::bf16, reference::random_values(DType::bf16, elems, rng)),
             k = reference::encode(DType::bf16, reference::random_values(DType::bf16, elems, rng)),
             v = reference::encode(DType::bf16, reference::random_values(DType::bf16, elems, rng));
  auto run = [&] {
    tools::DeviceBuffer bq(bytes), bk(bytes), bv(bytes), out(bytes), lse(lse_bytes);
    bq.upload(q), bk.upload(k), bv.upload(v);
    BSJIT_CU(runtime::driver().cuMemsetD8(out.ptr, 0xff, bytes));  // NaN in bf16
    attn.forward(bq.get(), bk.get(), bv.get(), out.get(), static_cast<float*>(lse.get()), kBatch, kHeads);
    BSJIT_CU(runtime::driver().cuCtxSynchronize());
    return out.download<std::uint16_t>();
  };
  const auto first = run();
  std::size_t poisoned = 0;
  for (auto x : first) poisoned += x == 0xffff;
  ASSERT_EQ(poisoned, 0u) << "outputs not written before the reset";
  reset_primary_context();
  const auto second = run();
  EXPECT_EQ(first, second) << "the forward after the reset differs from the one before";
}

}  // namespace
}  // namespace bsjit
