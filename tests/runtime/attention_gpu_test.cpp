// GPU tests (ctest label "gpu") of the fused attention forward against the double-precision
// reference (tools/attention_reference): every block size, head dim 32/64/128, fp16 and bf16, both
// tensor orders, causal or not, key padding, per-head masks with empty rows and a shared mask;
// fresh random inputs, outputs poisoned with NaN before each run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attention_cases.hpp"
#include "attention_reference.hpp"
#include "bsjit/bsjit.hpp"
#include "device_buffer.hpp"
#include "generator/attention_generator.hpp"
#include "reference.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

using Case = testing::AttentionCase;
using testing::case_name;

class AttentionGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    set_cache_directory({});
  }
};

TEST_P(AttentionGpu, ForwardMatchesReference) {
  const Case c = GetParam();
  const std::int64_t blocks = std::max(2, 256 / c.block), seq = blocks * c.block, batch = 2, heads = 3;
  std::mt19937_64 rng(100 + c.block + c.head_dim);
  // per-head masks: causal; sliding window; random with an empty block row 1
  std::vector<std::uint8_t> random_mask(blocks * blocks);
  for (auto& x : random_mask) x = rng() % 3 == 0;
  for (std::int64_t j = 0; j < blocks; ++j) random_mask[1 * blocks + j] = 0;
  random_mask[0] = 1;
  for (int shared = 0; shared < 2; ++shared) {
    std::vector<Layout> masks = shared ? std::vector<Layout>{layouts::sliding_window(blocks, 2)}
                                       : std::vector<Layout>{layouts::causal(blocks), layouts::sliding_window(blocks, 2),
                                                             Layout::from_dense(blocks, blocks, random_mask)};
    Attention attn(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, ""});
    reference::AttentionProblem p;
    p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = seq, p.head_dim = c.head_dim, p.block = c.block;
    p.layouts = masks, p.order = c.order, p.causal = c.causal;
    p.key_padding.assign(batch * seq, 1);
    for (std::int64_t j = seq - 3; j < seq; ++j) p.key_padding[1 * seq + j] = 0;  // batch 1: last 3 keys padded
    const std::size_t n = batch * seq * heads * c.head_dim;
    const auto q = reference::random_values(c.dtype, n, rng), k = reference::random_values(c.dtype, n, rng),
               v = reference::random_values(c.dtype, n, rng);
    tools::DeviceBuffer dq(n * 2), dk(n * 2), dv(n * 2), dout(n * 2), dlse(batch * heads * seq * 4), dpad(batch * seq);
    dq.upload(reference::encode(c.dtype, q));
    dk.upload(reference::encode(c.dtype, k));
    dv.upload(reference::encode(c.dtype, v));
    dpad.upload(p.key_padding);
    BSJIT_CU(runtime::driver().cuMemsetD8(dout.ptr, 0xff, n * 2));  // NaN poison
    BSJIT_CU(runtime::driver().cuMemsetD8(dlse.ptr, 0xff, dlse.bytes));
    attn.forward(dq.get(), dk.get(), dv.get(), dout.get(), static_cast<float*>(dlse.get()), batch, heads, nullptr, 0,
                 static_cast<const std::uint8_t*>(dpad.get()));
    BSJIT_CU(runtime::driver().cuCtxSynchronize());
    const auto want = reference::attention_forward(p, q, k, v);
    const auto got = reference::decode(c.dtype, dout.download());
    const auto lse = dlse.download<float>();
    SCOPED_TRACE(fmt::format("{} {} mask(s)", case_name(c), masks.size()));
    EXPECT_LE(reference::relative_error(got, want.out), 1e-2);
    double worst_lse = 0;
    for (std::size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(want.lse[i])) {
        EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i << " attends no key: lse " << lse[i];
        continue;
      }
      worst_lse = std::max(worst_lse, std::abs(lse[i] - want.lse[i]));
    }
    EXPECT_LE(worst_lse, 2e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpu, ::testing::ValuesIn(testing::all_attention_cases()),
                         [](const auto& info) { return case_name(info.param); });

// The backward on every case:
// dQ, dK, dV against the reference's gradients, from the GPU's own forward (out, lse), with
// per-head masks (an empty block row among them), key padding, outputs poisoned.
class AttentionBackwardGpu : public AttentionGpu {};

// attn's forward then backward on fresh random inputs (key padding on batch 0's last 5 keys),
// gradients against the reference's; K, V, dK and dV with heads / kv_group heads.
// With check_forward, the output against the reference's too.
void expect_gradients(const Attention& attn, const Case& c, const std::vector<Layout>& masks, std::mt19937_64& rng,
                      std::int64_t batch = 2, std::int64_t heads = 3, bool check_forward = false) {
  const std::int64_t seq = masks[0].rows() * c.block;
  reference::AttentionProblem p;
  p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = seq, p.head_dim = c.head_dim, p.block = c.block;
  p.layouts = masks, p.order = c.order, p.causal = c.causal, p.kv_group = attn.options().kv_group;
  p.key_padding.assign(batch * seq, 1);
  for (std::int64_t j = seq - 5; j < seq; ++j) p.key_padding[0 * seq + j] = 0;
  const std::size_t n = batch * seq * heads * c.head_dim, nk = n / p.kv_group;
  const auto q = reference::random_values(c.dtype, n, rng), k = reference::random_values(c.dtype, nk, rng),
             v = reference::random_values(c.dtype, nk, rng), dout = reference::random_values(c.dtype, n, rng);
  tools::DeviceBuffer dq_in(n * 2), dk_in(nk * 2), dv_in(nk * 2), d_out(n * 2), d_dout(n * 2),
      dlse(batch * heads * seq * 4), dpad(batch * seq), dq(n * 2), dk(nk * 2), dv(nk * 2);
  dq_in.upload(reference::encode(c.dtype, q));
  dk_in.upload(reference::encode(c.dtype, k));
  dv_in.upload(reference::encode(c.dtype, v));
  d_dout.upload(reference::encode(c.dtype, dout));
  dpad.upload(p.key_padding);
  for (auto* b : {&dq, &dk, &dv}) BSJIT_CU(runtime::driver().cuMemsetD8(b->ptr, 0xff, b->bytes));  // NaN poison
  const auto* pad = static_cast<const std::uint8_t*>(dpad.get());
  attn.forward(dq_in.get(), dk_in.get(), dv_in.get(), d_out.get(), static_cast<float*>(dlse.get()), batch, heads,
               nullptr, 0, pad);
  attn.backward(dq_in.get(), dk_in.get(), dv_in.get(), d_out.get(), static_cast<const float*>(dlse.get()),
                d_dout.get(), dq.get(), dk.get(), dv.get(), batch, heads, nullptr, 0, pad);
  BSJIT_CU(runtime::driver().cuCtxSynchronize());
  SCOPED_TRACE(fmt::format("{} at {} positions", case_name(c), seq));
  if (check_forward) {
    const auto out = reference::decode(c.dtype, d_out.download());
    EXPECT_LE(reference::relative_error(out, reference::attention_forward(p, q, k, v).out), 1e-2) << "out";
  }
  const auto want = reference::attention_backward(p, q, k, v, dout);
  EXPECT_LE(reference::relative_error(reference::decode(c.dtype, dq.download()), want.dq), 1e-2) << "dq";
  EXPECT_LE(reference::relative_error(reference::decode(c.dtype, dk.download()), want.dk), 1e-2) << "dk";
  EXPECT_LE(reference::relative_error(reference::decode(c.dtype, dv.download()), want.dv), 1e-2) << "dv";
}

TEST_P(AttentionBackwardGpu, GradientsMatchReference) {
  const Case c = GetParam();
  // block 64: an odd number of key blocks (the Hopper kernel pairs them: a last half pair)
  const std::int64_t blocks = c.block == 64 ? 5 : std::max(2, 256 / c.block);
  std::mt19937_64 rng(300 + c.block + c.head_dim);
  std::vector<std::uint8_t> random_mask(blocks * blocks);
  for (auto& x : random_mask) x = rng() % 3 == 0;
  for (std::int64_t j = 0; j < blocks; ++j) random_mask[1 * blocks + j] = 0;
  random_mask[blocks - 1] = 1;  // a key block above the diagonal: fully masked when causal
  const std::vector<Layout> masks{layouts::causal(blocks), layouts::sliding_window(blocks, 2, false),
                                  Layout::from_dense(blocks, blocks, random_mask)};
  Attention attn(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, ""});
  expect_gradients(attn, c, masks, rng);
}

// Two sequence lengths, one compile (the fused kernels' sources hold no length; their tables and
// dims come with each cache entry): each length's forward and backward right, run in turns, the
// second length compiling nothing.
TEST_F(AttentionBackwardGpu, TwoSequenceLengthsShareOneCompile) {
  for (int block : {64, 128}) {
    const Case c{block, 64, DType::bf16, QkvOrder::bhsd, true};
    const std::vector<Layout> short_masks{layouts::causal(3)}, long_masks{layouts::bigbird(7, 1, 1, 2, 5)};
    const AttentionOptions o{c.block, c.head_dim, c.dtype, c.order, c.causal, ""};
    const Attention short_attn(short_masks, o), long_attn(long_masks, o);
    std::mt19937_64 rng(500 + block);
    const auto before = cache_stats();
    expect_gradients(short_attn, c, short_masks, rng);
    EXPECT_EQ(cache_stats().compiles, before.compiles + 4) << "forward, backward main, prep, dq";
    expect_gradients(long_attn, c, long_masks, rng);
    expect_gradients(short_attn, c, short_masks, rng);
    EXPECT_EQ(cache_stats().compiles, before.compiles + 4) << "block " << block;
    EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 4) << "block " << block;
  }
}

// A service that builds an Attention per request: objects of one mask share their loaded kernels,
// a dropped object's kernels stay loaded (parked) for the next request up to SharedKernels::kParked,
// beyond which the older half is unloaded, so loaded modules and table memory stay bounded however many
// masks come; kernels unloaded and reloaded, or parked and taken back, compute right.
TEST_F(AttentionBackwardGpu, ObjectsPerRequestShareAndReleaseTheirKernels) {
  auto& shared = runtime::SharedKernels::global();
  const Case c{64, 64, DType::bf16, QkvOrder::bhsd, true};
  const AttentionOptions o{c.block, c.head_dim, c.dtype, c.order, c.causal, ""};
  // distinct masks of one shape: causal plus the bits of i above the diagonal (masked anyway)
  auto mask = [](int i) {
    auto dense = std::vector<std::uint8_t>(25, 0);
    for (int r = 0; r < 5; ++r)
      for (int col = 0; col <= r; ++col) dense[r * 5 + col] = 1;
    const int upper[] = {1, 2, 3, 4, 7, 8, 9, 13, 14, 19};
    for (int bit = 0; bit < 10; ++bit)
      if (i >> bit & 1) dense[upper[bit]] = 1;
    return std::vector<Layout>{Layout::from_dense(5, 5, dense)};
  };
  std::mt19937_64 rng(700);
  const auto [held0, parked0] = shared.counts();
  {
    const Attention a(mask(0), o), b(mask(0), o);
    expect_gradients(a, c, mask(0), rng);
    expect_gradients(b, c, mask(0), rng);
    EXPECT_EQ(shared.counts().first, held0 + 4) << "two objects of one mask share forward, prep, dq, main";
  }
  EXPECT_EQ(shared.counts().first, held0);
  constexpr int kRequests = static_cast<int>(runtime::SharedKernels::kParked) + 6;
  for (int i = 1; i <= kRequests; ++i) {
    const Attention attn(mask(i), o);
    if (i % 10 == 0 || i == kRequests) {
      expect_gradients(attn, c, mask(i), rng);
    } else {
      attn.load();  // forward and backward loaded, not run (the test's time)
      EXPECT_EQ(shared.counts().first, held0 + 4);
    }
  }
  const auto [held, parked] = shared.counts();
  EXPECT_EQ(held, held0);
  EXPECT_LE(parked, runtime::SharedKernels::kParked) << "released kernels beyond the bound are unloaded";
  EXPECT_GE(parked, runtime::SharedKernels::kParked / 2) << "the most recently released stay loaded";
  // the last request's kernels are parked: taken back, not loaded again; mask 0's were unloaded
  {
    const Attention last(mask(kRequests), o);
    expect_gradients(last, c, mask(kRequests), rng);
    EXPECT_EQ(shared.counts(), std::make_pair(held0 + 4, parked - 4));
  }
  const Attention first(mask(0), o);
  expect_gradients(first, c, mask(0), rng);
  EXPECT_EQ(shared.counts().first, held0 + 4);
}

// A workspace from the caller gives the gradients bsjit's own does, bit for bit; one too small is
// refused before launch.
TEST_F(AttentionBackwardGpu, CallerWorkspaceGivesTheSameGradients) {
  const Case c{64, 64, DType::bf16, QkvOrder::bshd, true};
  const std::vector<Layout> masks{layouts::causal(4)};
  const Attention attn(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, ""});
  const std::int64_t batch = 2, heads = 3, n = batch * attn.seq_q() * heads * c.head_dim;
  std::mt19937_64 rng(950);
  tools::DeviceBuffer q(n * 2), k(n * 2), v(n * 2), out(n * 2), dout(n * 2), lse(batch * heads * attn.seq_q() * 4);
  for (auto* b : {&q, &k, &v, &dout}) b->upload(reference::encode(c.dtype, reference::random_values(c.dtype, n, rng)));
  attn.forward(q.get(), k.get(), v.get(), out.get(), static_cast<float*>(lse.get()), batch, heads);
  std::vector<std::vector<std::uint16_t>> grads;
  runtime::DeviceMemory workspace(attn.backward_workspace_size(batch, heads));
  for (void* w : {static_cast<void*>(nullptr), workspace.get()}) {
    tools::DeviceBuffer dq(n * 2), dk(n * 2), dv(n * 2);
    attn.backward(q.get(), k.get(), v.get(), out.get(), static_cast<const float*>(lse.get()), dout.get(), dq.get(),
                  dk.get(), dv.get(), batch, heads, nullptr, 0, nullptr, w, w ? workspace.bytes : 0);
    BSJIT_CU(runtime::driver().cuCtxSynchronize());
    for (auto* g : {&dq, &dk, &dv}) grads.push_back(g->download<std::uint16_t>());
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(grads[i], grads[i + 3]) << "gradient " << i;
  EXPECT_THROW(
      attn.backward(q.get(), k.get(), v.get(), out.get(), static_cast<const float*>(lse.get()), dout.get(), q.get(),
                    k.get(), v.get(), batch, heads, nullptr, 0, nullptr, workspace.get(), workspace.bytes - 16),
      Error);
}

// A long sequence with many key blocks per query row: S = 8192 at block 128 (up to 64 key blocks a
// row under the causal mask; a window of 9 blocks plus 2 global ones), one batch and head, the
// headline configuration (head dim 128, bf16, [b, h, s, d], causal), forward and backward. (The
// double-precision reference of the causal mask takes about 31 s on one core of the 2-core machine
// and runs over all cores; on one core and before 76453c4 both masks took 274 s on the H100 host.)
TEST_F(AttentionBackwardGpu, LongSequenceManyKeyBlocksPerRow) {
  const Case c{128, 128, DType::bf16, QkvOrder::bhsd, true};
  const AttentionOptions o{c.block, c.head_dim, c.dtype, c.order, c.causal, ""};
  for (const Layout& mask : {layouts::causal(64), layouts::unite(layouts::sliding_window(64, 9, false),
                                                                 layouts::global_tokens(64, 2, false, true))}) {
    ASSERT_GE(mask.stats().max_blocks_per_row, 8);
    const std::vector<Layout> masks{mask};
    const Attention attn(masks, o);
    std::mt19937_64 rng(900 + mask.blocks());
    expect_gradients(attn, c, masks, rng, 1, 1, true);
  }
}

// Grouped-query attention: 4 query heads over 4, 2 and 1 key/value heads (multi-head, grouped,
// multi-query), forward and backward (dK, dV summed over each group), per-head masks and a shared
// one, on the mma.sync kernels (block 32) and the Hopper ones (block 64 and 128 on sm_90a), both
// orders; with kv_group 1 the backward runs its three kernels, else four.
TEST_F(AttentionBackwardGpu, GroupedQueryAttentionMatchesReference) {
  for (int block : {32, 64, 128})
    for (int d : {64, 128})
      for (QkvOrder order : {QkvOrder::bshd, QkvOrder::bhsd})
        for (int group : {1, 2, 4}) {
          const Case c{block, d, DType::bf16, order, group == 2};
          const std::int64_t blocks = block == 64 ? 5 : std::max(2, 256 / block);
          std::mt19937_64 rng(1100 + block + d + group);
          std::vector<std::uint8_t> random_mask(blocks * blocks);
          for (auto& x : random_mask) x = rng() % 3 == 0;
          random_mask[blocks - 1] = 1;
          const std::vector<Layout> per_head{
              layouts::causal(blocks), layouts::sliding_window(blocks, 2, false),
              Layout::from_dense(blocks, blocks, random_mask),
              Layout::from_dense(blocks, blocks, std::vector<std::uint8_t>(blocks * blocks, 1))};
          for (const auto& masks : {per_head, std::vector<Layout>{layouts::sliding_window(blocks, 2, false)}}) {
            SCOPED_TRACE(fmt::format("kv_group {} (4 query heads), {} mask(s)", group, masks.size()));
            const Attention attn(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, "", group});
            expect_gradients(attn, c, masks, rng, 2, 4, true);
          }
        }
}

// Groups as models have them: 16 query heads over 2 key/value heads (a group of 8, suite A's
// grouped case) and over 1, causal, both Hopper blocks and head dims, forward and backward.
TEST_F(AttentionBackwardGpu, GroupsOfEightAndSixteenQueryHeads) {
  for (int block : {64, 128})
    for (int d : {64, 128})
      for (int group : {8, 16}) {
        const Case c{block, d, DType::bf16, QkvOrder::bhsd, true};
        const std::vector<Layout> masks{layouts::causal(256 / block)};
        SCOPED_TRACE(fmt::format("kv_group {} (16 query heads)", group));
        const Attention attn(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, "", group});
        std::mt19937_64 rng(1300 + block + d + group);
        expect_gradients(attn, c, masks, rng, 1, 16, true);
      }
}

// Block-64 masks whose tiles of 128 are mostly live run on the block-128 Hopper kernels with the
// dead 64-blocks of each tile masked (generator::CoarseMasks): per-head masks with dead quadrants
// scattered, an empty block row and a causal one, both head dims, forward and backward against the
// reference (the masks chosen so that the forward coarsens, and the backward at head dim 128, which
// the test asserts; at 64 the backward runs where generator::coarse_attention puts it).
TEST_F(AttentionBackwardGpu, Block64MasksOnTilesOf128MatchReference) {
  const runtime::Context ctx = runtime::current_context();
  if (runtime::default_kernel_arch(runtime::context_arch(ctx)) != "sm_90a") GTEST_SKIP() << "the Hopper kernels only";
  constexpr std::int64_t blocks = 16;
  auto holes = [](std::int64_t count, std::int64_t empty_row) {
    std::vector<std::uint8_t> dense(blocks * blocks, 1);
    for (std::int64_t i = 0; i < count; ++i) dense[(i * 37 + 5) % (blocks * blocks)] = 0;
    if (empty_row >= 0)
      for (std::int64_t j = 0; j < blocks; ++j) dense[empty_row * blocks + j] = 0;
    return Layout::from_dense(blocks, blocks, dense);
  };
  const std::vector<Layout> d128_masks{holes(9, 3), layouts::causal(blocks), holes(4, -1)};
  const std::vector<Layout> d64_masks{holes(5, -1)};
  const Case cases[] = {{64, 128, DType::bf16, QkvOrder::bhsd, true},
                        {64, 128, DType::f16, QkvOrder::bshd, false},
                        {64, 64, DType::bf16, QkvOrder::bshd, true},
                        {64, 64, DType::f16, QkvOrder::bhsd, false}};
  for (const Case& c : cases) {
    const auto& masks = c.head_dim == 128 ? d128_masks : d64_masks;
    const AttentionOptions o{c.block, c.head_dim, c.dtype, c.order, c.causal, ""};
    ASSERT_EQ(generator::generate_attention_forward(masks, o, "sm_90a").block, 128) << case_name(c);
    const bool coarse_backward = generator::coarse_attention(masks, o, "sm_90a", true).has_value();
    ASSERT_TRUE(coarse_backward || c.head_dim == 64) << case_name(c);
    ASSERT_EQ(generator::generate_attention_backward(masks, o, "sm_90a").block, coarse_backward ? 128 : 64)
        << case_name(c);
    const Attention attn(masks, o);
    std::mt19937_64 rng(1500 + c.head_dim + c.causal);
    expect_gradients(attn, c, masks, rng, 2, static_cast<std::int64_t>(masks.size()), true);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionBackwardGpu, ::testing::ValuesIn(testing::all_attention_cases()),
                         [](const auto& info) { return case_name(info.param); });

TEST(AttentionApi, ChecksItsArguments) {
  Attention attn({layouts::causal(4), layouts::causal(4)}, {64, 64, DType::bf16, QkvOrder::bshd, true, ""});
  EXPECT_EQ(attn.seq_q(), 256);
  alignas(16) static char buf[64];
  float lse[4];
  // two masks: heads must be 2; null and misaligned pointers; all before any GPU work
  EXPECT_THROW(attn.forward(buf, buf, buf, buf, lse, 1, 3), Error);
  EXPECT_THROW(attn.forward(nullptr, buf, buf, buf, lse, 1, 2), Error);
  EXPECT_THROW(attn.forward(buf + 1, buf, buf, buf, lse, 1, 2), Error);
  EXPECT_THROW(attn.forward(buf, buf, buf, buf, nullptr, 1, 2), Error);
  EXPECT_THROW(attn.forward(buf, buf, buf, buf, lse, 0, 2), Error);
  // the backward's: every pointer set and aligned, heads fitting the masks (the message says which,
  // so that a failure further on, e.g. no driver, does not pass for the check)
  auto* l = reinterpret_cast<const float*>(buf);
  auto message = [](auto call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { attn.backward(buf, buf, buf, buf, l, buf, buf, buf, buf, 1, 3); }).find("heads = 3"),
            std::string::npos);
  EXPECT_NE(message([&] { attn.backward(buf, buf, buf, buf, l, buf, nullptr, buf, buf, 1, 2); }).find("dq is a null"),
            std::string::npos);
  EXPECT_NE(message([&] { attn.backward(buf, buf, buf, buf, l, buf, buf, buf + 2, buf, 1, 2); }).find("dk ("),
            std::string::npos);
  EXPECT_NE(message([&] { attn.backward(buf, buf, buf, buf, nullptr, buf, buf, buf, buf, 1, 2); }).find("lse is a null"),
            std::string::npos);
  // grouped-query attention: heads a multiple of kv_group
  Attention grouped({layouts::causal(4)}, {64, 64, DType::bf16, QkvOrder::bshd, true, "", 2});
  EXPECT_NE(message([&] { grouped.forward(buf, buf, buf, buf, lse, 1, 3); }).find("not a multiple of kv_group = 2"),
            std::string::npos);
  EXPECT_NE(message([&] {
              grouped.backward(buf, buf, buf, buf, l, buf, buf, buf, buf, 1, 5);
            }).find("not a multiple of kv_group = 2"),
            std::string::npos);
  EXPECT_EQ(grouped.backward_workspace_size(2, 4), (2 * 4 * 256 * (64 + 1) + 2 * 2 * 2 * 256 * 64) * sizeof(float))
      << "dQ accumulator and Delta, then the dK and dV accumulators of 2 key/value heads";
}

}  // namespace
}  // namespace bsjit
