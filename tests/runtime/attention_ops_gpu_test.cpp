// GPU tests (ctest label "gpu") of the decomposed attention ops (bsjit::AttentionOps) against the
// double-precision reference (tools/attention_reference): each op fed the GPU's own outputs of the
// ops before it, so that every op is checked on its own, and the chained forward against fused
// attention; per-head masks with an empty block row, key padding, element masks (a callback, and
// the same masks as bits giving the same probabilities), outputs poisoned with NaN.
// The argument checks run without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "attention_cases.hpp"
#include "attention_reference.hpp"
#include "bsjit/bsjit.hpp"
#include "device_buffer.hpp"
#include "reference.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

using Case = testing::AttentionCase;
using testing::case_name;

// Pairs masked inside the blocks of even (row + column): a diagonal stripe pattern, head-dependent.
bool element_keeps(std::int64_t head, std::int64_t query, std::int64_t key, int block) {
  if ((query / block + key / block) % 2 != 0) return true;
  return (query + 2 * key + head) % 5 != 0;
}

class AttentionOpsGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    set_cache_directory({});
  }
};

TEST_P(AttentionOpsGpu, EveryOpMatchesReference) {
  const Case c = GetParam();
  const std::int64_t blocks = std::max(2, 256 / c.block), seq = blocks * c.block, batch = 2, heads = 3;
  std::mt19937_64 rng(500 + c.block + c.head_dim);
  std::vector<std::uint8_t> random_mask(blocks * blocks);
  for (auto& x : random_mask) x = rng() % 3 == 0;
  for (std::int64_t j = 0; j < blocks; ++j) random_mask[1 * blocks + j] = 0;  // an empty block row
  random_mask[blocks - 1] = 1;  // above the diagonal: fully masked when causal
  const std::vector<Layout> masks{layouts::causal(blocks), layouts::sliding_window(blocks, 2, false),
                                  Layout::from_dense(blocks, blocks, random_mask)};
  const int block = c.block;
  ElementMasks em;
  em.callback = [block](std::int64_t m, std::int64_t r, std::int64_t col, std::uint8_t* keep) {
    for (int i = 0; i < block; ++i)
      for (int j = 0; j < block; ++j) keep[i * block + j] = element_keeps(m, r * block + i, col * block + j, block);
  };
  const AttentionOptions options{c.block, c.head_dim, c.dtype, c.order, c.causal, ""};
  AttentionOps ops(masks, options, em);

  reference::AttentionProblem p;
  p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = seq, p.head_dim = c.head_dim, p.block = c.block;
  p.layouts = masks, p.order = c.order, p.causal = c.causal;
  p.key_padding.assign(batch * seq, 1);
  for (std::int64_t j = seq - 3; j < seq; ++j) p.key_padding[1 * seq + j] = 0;
  p.element_mask = [block](std::int64_t h, std::int64_t q, std::int64_t k) { return element_keeps(h, q, k, block); };
  ASSERT_EQ(ops.sparse_elements(heads) * batch, reference::block_sparse_size(p));

  const std::size_t n = batch * seq * heads * c.head_dim, ns = reference::block_sparse_size(p);
  auto dense = [&] { return reference::random_values(c.dtype, n, rng); };
  const auto q = dense(), k = dense(), v = dense(), dout = dense();
  auto upload = [&](const std::vector<double>& x) {
    auto b = std::make_unique<tools::DeviceBuffer>(x.size() * 2);
    b->upload(reference::encode(c.dtype, x));
    return b;
  };
  auto poisoned = [&](std::size_t count) {
    auto b = std::make_unique<tools::DeviceBuffer>(count * 2);
    BSJIT_CU(runtime::driver().cuMemsetD8(b->ptr, 0xff, count * 2));
    return b;
  };
  const auto dq_in = upload(q), dk_in = upload(k), dv_in = upload(v), d_dout = upload(dout);
  tools::DeviceBuffer dpad(batch * seq);
  dpad.upload(p.key_padding);
  const auto* pad = static_cast<const std::uint8_t*>(dpad.get());
  const auto s = poisoned(ns), pr = poisoned(ns), dp = poisoned(ns), ds = poisoned(ns), pr_bits = poisoned(ns);
  const auto o = poisoned(n), dq = poisoned(n), dk = poisoned(n), dv = poisoned(n);

  ops.scores(dq_in->get(), dk_in->get(), s->get(), batch, heads);
  ops.softmax(s->get(), pr->get(), batch, heads, nullptr, 0, pad);
  ops.probs_v(pr->get(), dv_in->get(), o->get(), batch, heads);
  ops.scores(d_dout->get(), dv_in->get(), dp->get(), batch, heads);
  ops.softmax_grad(pr->get(), dp->get(), ds->get(), batch, heads);
  ops.probs_t(pr->get(), d_dout->get(), dv->get(), batch, heads);
  ops.probs_v(ds->get(), dk_in->get(), dq->get(), batch, heads);
  ops.probs_t(ds->get(), dq_in->get(), dk->get(), batch, heads);
  // the same element masks given as bits
  ElementMasks as_bits;
  const std::int64_t bb = static_cast<std::int64_t>(block) * block;
  std::int64_t total_blocks = 0;
  for (const auto& m : masks) total_blocks += m.blocks();
  as_bits.bits.assign(total_blocks * bb / 32, 0u);
  std::int64_t at = 0;
  for (std::size_t m = 0; m < masks.size(); ++m)
    for (const auto& [r, col] : masks[m].coords())
      for (std::int64_t i = 0; i < bb; ++i, ++at)
        if (element_keeps(m, r * block + i / block, col * block + i % block, block))
          as_bits.bits[at / 32] |= 1u << (at % 32);
  {
    const auto held = runtime::SharedKernels::global().counts().first;
    const AttentionOps bits_ops(masks, options, as_bits);
    bits_ops.softmax(s->get(), pr_bits->get(), batch, heads, nullptr, 0, pad);
    EXPECT_EQ(runtime::SharedKernels::global().counts().first, held) << "two objects of one mask share a kernel";
  }
  BSJIT_CU(runtime::driver().cuCtxSynchronize());

  auto got = [&](const std::unique_ptr<tools::DeviceBuffer>& b) { return reference::decode(c.dtype, b->download()); };
  const auto s_g = got(s), p_g = got(pr), dp_g = got(dp), ds_g = got(ds);
  SCOPED_TRACE(case_name(c));
  EXPECT_LE(reference::relative_error(s_g, reference::block_scores(p, q, k)), 1e-2) << "scores";
  EXPECT_LE(reference::relative_error(p_g, reference::block_softmax(p, s_g)), 1e-2) << "softmax";
  EXPECT_EQ(pr->download(), pr_bits->download()) << "element masks as bits and as a callback differ";
  EXPECT_LE(reference::relative_error(got(o), reference::block_probs_v(p, p_g, v)), 1e-2) << "probs_v";
  EXPECT_LE(reference::relative_error(dp_g, reference::block_scores(p, dout, v)), 1e-2) << "scores(dout, v)";
  EXPECT_LE(reference::relative_error(ds_g, reference::block_softmax_grad(p, p_g, dp_g)), 1e-2) << "softmax_grad";
  EXPECT_LE(reference::relative_error(got(dv), reference::block_probs_t(p, p_g, dout)), 1e-2) << "probs_t (dv)";
  EXPECT_LE(reference::relative_error(got(dq), reference::block_probs_v(p, ds_g, k)), 1e-2) << "probs_v (dq)";
  EXPECT_LE(reference::relative_error(got(dk), reference::block_probs_t(p, ds_g, q)), 1e-2) << "probs_t (dk)";
  // the chain end to end: attention with the element masks
  EXPECT_LE(reference::relative_error(got(o), reference::attention_forward(p, q, k, v).out), 2e-2) << "forward";
}

INSTANTIATE_TEST_SUITE_P(Some, AttentionOpsGpu, ::testing::ValuesIn(testing::every_third_attention_case(1)),
                         [](const auto& info) { return case_name(info.param); });

// Grouped-query attention through the ops: 4 query heads over 2 and 1 key/value heads, per-head
// masks (an empty block row among them) and a shared one, both orders. scores and probs_v read
// K-shaped tensors of heads / kv_group heads; probs_t sums each group's query heads into one.
TEST_F(AttentionOpsGpu, GroupedQueryHeadsMatchReference) {
  for (int block : {32, 64})
    for (QkvOrder order : {QkvOrder::bshd, QkvOrder::bhsd})
      for (int group : {2, 4}) {
        const Case c{block, 64, DType::bf16, order, group == 2};
        const std::int64_t blocks = std::max(2, 256 / block), seq = blocks * block, batch = 2, heads = 4;
        std::mt19937_64 rng(1300 + block + group);
        std::vector<std::uint8_t> random_mask(blocks * blocks);
        for (auto& x : random_mask) x = rng() % 3 == 0;
        for (std::int64_t j = 0; j < blocks; ++j) random_mask[1 * blocks + j] = 0;
        const std::vector<Layout> per_head{layouts::causal(blocks), Layout::from_dense(blocks, blocks, random_mask),
                                           layouts::sliding_window(blocks, 2, false), layouts::causal(blocks)};
        for (const auto& masks : {per_head, std::vector<Layout>{layouts::sliding_window(blocks, 3, false)}}) {
          SCOPED_TRACE(fmt::format("{} kv_group {} (4 query heads), {} mask(s)", case_name(c), group, masks.size()));
          const AttentionOps ops(masks, {c.block, c.head_dim, c.dtype, c.order, c.causal, "", group});
          reference::AttentionProblem p;
          p.batch = batch, p.heads = heads, p.seq_q = p.seq_k = seq, p.head_dim = c.head_dim, p.block = c.block;
          p.layouts = masks, p.order = c.order, p.causal = c.causal, p.kv_group = group;
          const std::size_t n = batch * seq * heads * c.head_dim, nk = n / group, ns = reference::block_sparse_size(p);
          const auto q = reference::random_values(c.dtype, n, rng), dout = reference::random_values(c.dtype, n, rng),
                     k = reference::random_values(c.dtype, nk, rng), v = reference::random_values(c.dtype, nk, rng);
          tools::DeviceBuffer dq_in(n * 2), d_dout(n * 2), dk_in(nk * 2), dv_in(nk * 2);
          dq_in.upload(reference::encode(c.dtype, q));
          d_dout.upload(reference::encode(c.dtype, dout));
          dk_in.upload(reference::encode(c.dtype, k));
          dv_in.upload(reference::encode(c.dtype, v));
          tools::DeviceBuffer s(ns * 2), pr(ns * 2), dp(ns * 2), ds(ns * 2), o(n * 2), dq(n * 2), dk(nk * 2),
              dv(nk * 2);
          for (auto* b : {&s, &pr, &dp, &ds, &o, &dq, &dk, &dv})
            BSJIT_CU(runtime::driver().cuMemsetD8(b->ptr, 0xff, b->bytes));
          ops.scores(dq_in.get(), dk_in.get(), s.get(), batch, heads);
          ops.softmax(s.get(), pr.get(), batch, heads);
          ops.probs_v(pr.get(), dv_in.get(), o.get(), batch, heads);
          ops.scores(d_dout.get(), dv_in.get(), dp.get(), batch, heads);
          ops.softmax_grad(pr.get(), dp.get(), ds.get(), batch, heads);
          ops.probs_t(pr.get(), d_dout.get(), dv.get(), batch, heads);
          ops.probs_v(ds.get(), dk_in.get(), dq.get(), batch, heads);
          ops.probs_t(ds.get(), dq_in.get(), dk.get(), batch, heads);
          BSJIT_CU(runtime::driver().cuCtxSynchronize());
          auto got = [&](tools::DeviceBuffer& b) { return reference::decode(c.dtype, b.download()); };
          const auto s_g = got(s), p_g = got(pr), dp_g = got(dp), ds_g = got(ds);
          EXPECT_LE(reference::relative_error(s_g, reference::block_scores(p, q, k)), 1e-2) << "scores";
          EXPECT_LE(reference::relative_error(got(o), reference::block_probs_v(p, p_g, v)), 1e-2) << "probs_v";
          EXPECT_LE(reference::relative_error(dp_g, reference::block_scores(p, dout, v)), 1e-2) << "scores(dout, v)";
          EXPECT_LE(reference::relative_error(got(dv), reference::block_probs_t(p, p_g, dout)), 1e-2) << "probs_t (dv)";
          EXPECT_LE(reference::relative_error(got(dq), reference::block_probs_v(p, ds_g, k)), 1e-2) << "probs_v (dq)";
          EXPECT_LE(reference::relative_error(got(dk), reference::block_probs_t(p, ds_g, q)), 1e-2) << "probs_t (dk)";
          EXPECT_LE(reference::relative_error(got(o), reference::attention_forward(p, q, k, v).out), 2e-2) << "forward";
        }
      }
}

std::string message(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(AttentionOpsApi, ChecksItsArguments) {
  const std::vector<Layout> masks{layouts::causal(4), layouts::sliding_window(4, 2)};
  const AttentionOptions options{32, 64, DType::bf16, QkvOrder::bshd, true, ""};
  AttentionOps ops(masks, options);
  EXPECT_EQ(ops.seq_q(), 128);
  EXPECT_EQ(ops.sparse_elements(2), (10 + 7) * 32 * 32);
  alignas(16) static char buf[64];
  EXPECT_NE(message([&] { ops.scores(buf, buf, buf, 1, 3); }).find("heads = 3"), std::string::npos);
  EXPECT_NE(message([&] { ops.softmax(buf, nullptr, 1, 2); }).find("p is a null"), std::string::npos);
  EXPECT_NE(message([&] { ops.probs_v(buf, buf + 4, buf, 1, 2); }).find("v ("), std::string::npos);
  EXPECT_NE(message([&] { ops.probs_t(buf, buf, buf, 0, 2); }).find("batch = 0"), std::string::npos);
  EXPECT_NE(message([&] { ops.softmax_grad(buf, buf, buf + 8, 1, 2); }).find("ds ("), std::string::npos);
  // element masks: one form only, and bits for every pair of every block
  ElementMasks both;
  both.callback = [](std::int64_t, std::int64_t, std::int64_t, std::uint8_t*) {};
  both.bits.assign(17 * 32, 0u);
  EXPECT_NE(message([&] { AttentionOps(masks, options, both); }).find("both"), std::string::npos);
  ElementMasks short_bits;
  short_bits.bits.assign(17 * 32 - 1, 0u);
  EXPECT_NE(message([&] { AttentionOps(masks, options, short_bits); }).find("need 544"), std::string::npos);
  EXPECT_NE(message([&] {
              AttentionOps(masks, {48, 64, DType::bf16, QkvOrder::bshd, false, ""});
            }).find("block 48"),
            std::string::npos);
  // grouped-query attention: whole groups of per-head masks, heads a multiple of kv_group
  EXPECT_NE(message([&] {
              AttentionOps(masks, {32, 64, DType::bf16, QkvOrder::bshd, true, "", 4});
            }).find("not whole groups of kv_group = 4"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AttentionOps(masks, {32, 64, DType::bf16, QkvOrder::bshd, true, "", 0});
            }).find("kv_group = 0"),
            std::string::npos);
  const AttentionOps grouped(masks, {32, 64, DType::bf16, QkvOrder::bshd, true, "", 2});
  EXPECT_NE(message([&] { grouped.probs_t(buf, buf, buf, 1, 3); }).find("heads = 3"), std::string::npos);
}

}  // namespace
}  // namespace bsjit
