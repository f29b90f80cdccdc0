// The attention generator: its per-row key tables rebuild the masks, options it cannot serve are
// refused, and every kernel variant compiles with NVRTC for sm_80 and sm_90a.
#include "attention_generator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "bsjit/attention_layouts.hpp"
#include "bsjit/error.hpp"
#include "runtime/compiler.hpp"
#include "runtime/parallel.hpp"

namespace bsjit::generator {
namespace {

// What is wrong with kernel `name` of g compiled for arch ("" if nothing): its cubin not empty, its
// wgmmas not serialized by ptxas (a product's accumulators read or spilled while it runs: the
// kernel still works, at a fraction of its speed), and every table of its source a symbol in it
// (the loader looks each up by name, also in kernels that read none of them).
template <typename Generated>
std::string compile_failures(const Generated& g, const std::string& name, const std::string& arch) {
  const auto k = runtime::compile(g.source, name, g.label, arch);
  if (k.cubin.size() <= 64) return g.label + ": cubin too small; ";
  if (const std::string losses = runtime::performance_losses(k.log); !losses.empty())
    return g.label + " " + name + ": " + losses + "; ";
  const std::string bytes(k.cubin.begin(), k.cubin.end());
  for (const auto& t : g.tables)
    if (bytes.find(t.name + '\0') == std::string::npos) return g.label + " " + name + ": no symbol " + t.name + "; ";
  return "";
}

// The values of table `name`, which g's source must declare (and not initialize).
template <typename Generated>
std::vector<int> array_of(const Generated& g, const std::string& name) {
  for (const auto& t : g.tables)
    if (t.name == name) {
      EXPECT_NE(g.source.find(declare(t)), std::string::npos) << name << " is not declared in\n" << g.source;
      return t.values;
    }
  ADD_FAILURE() << "no table " << name << " in " << g.label;
  return {};
}

TEST(AttentionGenerator, TablesRebuildEveryHeadsMask) {
  const std::vector<Layout> masks = {layouts::causal(6), layouts::bigbird(6, 1, 1, 1, 7),
                                     Layout::from_coords(6, 6, {{0, 5}, {3, 1}, {3, 2}})};  // empty rows
  const auto g = generate_attention_forward(masks, {64, 64, DType::bf16, QkvOrder::bshd, true, ""}, "sm_80");
  const auto starts = array_of(g, "kRowStart"), keys = array_of(g, "kKeys");
  ASSERT_EQ(starts.size(), 3u * 6 + 1);
  for (std::size_t m = 0; m < masks.size(); ++m)
    for (int r = 0; r < 6; ++r) {
      std::vector<std::uint8_t> row(6, 0);
      for (int i = starts[m * 6 + r]; i < starts[m * 6 + r + 1]; ++i) row[keys[i]] = 1;
      for (int c = 0; c < 6; ++c) EXPECT_EQ(row[c] != 0, masks[m].at(r, c)) << "mask " << m << " row " << r;
    }
  EXPECT_EQ(g.seq_q, 384);
  EXPECT_EQ(g.query_tiles, 6);
  EXPECT_EQ(g.threads, 128);
  EXPECT_FALSE(g.tma);
  EXPECT_NE(g.source.find("kCausal = true"), std::string::npos);
  // launch order: every query tile once, the most key blocks (over all masks) first
  const auto order = array_of(g, "kTileOrder");
  ASSERT_EQ(order.size(), 6u);
  auto work = [&](int t) { return starts[t + 1] - starts[t] + starts[6 + t + 1] - starts[6 + t] + starts[12 + t + 1] - starts[12 + t]; };
  std::vector<int> seen(6, 0);
  for (std::size_t i = 0; i < order.size(); ++i) {
    ++seen.at(order[i]);
    if (i > 0) {
      EXPECT_GE(work(order[i - 1]), work(order[i])) << "position " << i;
    }
  }
  EXPECT_EQ(seen, std::vector<int>(6, 1));

  // sm_90a: the warpgroup kernel, one query block per CTA, a consumer warpgroup per 64 rows
  for (int block : {64, 128}) {
    const auto h = generate_attention_forward(masks, {block, 128, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90a");
    EXPECT_TRUE(h.tma);
    EXPECT_EQ(h.threads, 128 + 128 * block / 64);
    EXPECT_EQ(h.q_rows, block);
    EXPECT_EQ(h.kv_rows, block);
    EXPECT_LE(h.shared_bytes, 227 * 1024);
    EXPECT_NE(h.name_expression.find("attention_forward_tma_kernel"), std::string::npos);
  }
  EXPECT_FALSE(generate_attention_forward(masks, {32, 128, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90a").tma);
  EXPECT_FALSE(generate_attention_forward(masks, {64, 32, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90a").tma);
  EXPECT_FALSE(generate_attention_forward(masks, {64, 64, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90").tma);
}

// The decomposed ops' tables: every block of every mask at one table position, found from its row
// (kRowStart, kKeys, kBlockRows) and from its column (kColStart, kQueryBlocks, kColPositions).
TEST(AttentionGenerator, OpsTablesFindEveryBlockByRowAndColumn) {
  const std::vector<Layout> masks = {layouts::causal(5), Layout::from_coords(5, 5, {{0, 4}, {3, 1}, {3, 2}, {4, 1}})};
  const auto g = generate_attention_ops(masks, {32, 64, DType::f16, QkvOrder::bhsd, false, ""});
  const auto row_start = array_of(g, "kRowStart"), keys = array_of(g, "kKeys"), block_rows = array_of(g, "kBlockRows"),
             col_start = array_of(g, "kColStart"), queries = array_of(g, "kQueryBlocks"),
             positions = array_of(g, "kColPositions");
  EXPECT_EQ(g.mask_blocks, 15 + 4);
  ASSERT_EQ(keys.size(), 19u);
  ASSERT_EQ(positions.size(), 19u);
  std::vector<int> seen(19, 0);
  int first = 0;
  for (std::size_t m = 0; m < masks.size(); ++m) {
    for (std::int64_t i = 0; i < masks[m].blocks(); ++i) {  // row-major: the mask's own block order
      const auto [r, c] = masks[m].block_coord(i);
      EXPECT_EQ(block_rows[first + i], r);
      EXPECT_EQ(keys[first + i], c);
      EXPECT_GE(first + i, row_start[m * 5 + r]);
      EXPECT_LT(first + i, row_start[m * 5 + r + 1]);
    }
    for (int c = 0; c < 5; ++c)
      for (int e = col_start[m * 5 + c]; e < col_start[m * 5 + c + 1]; ++e) {
        const int pos = positions[e];
        ++seen.at(pos);
        EXPECT_EQ(keys[pos], c) << "mask " << m << " column " << c;
        EXPECT_EQ(block_rows[pos], queries[e]);
        EXPECT_EQ(pos - first, masks[m].block_index(queries[e], c));
      }
    first += static_cast<int>(masks[m].blocks());
  }
  EXPECT_EQ(seen, std::vector<int>(19, 1));
  EXPECT_EQ(g.tile, 32);
  EXPECT_EQ(g.score_tiles, 15);  // the most blocks of a mask, one tile each at block 32
  EXPECT_EQ(g.query_tiles, 5);
  EXPECT_EQ(g.softmax_rows4, 5 * 32 / 4);
  EXPECT_EQ(generate_attention_ops(masks, {128, 64, DType::f16, QkvOrder::bhsd, false, ""}).score_tiles, 15 * 4);
}

// The Hopper backward takes 128 keys per CTA: a block of 128, or a pair of block columns of 64 (an
// odd count leaves a last half pair), launched the most work first.
TEST(AttentionGenerator, HopperBackwardPairsBlocksOf64) {
  const std::vector<Layout> masks = {layouts::causal(5)};
  const auto pairs = generate_attention_backward(masks, {64, 128, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90a");
  EXPECT_TRUE(pairs.tma);
  EXPECT_EQ(pairs.key_tiles, 3);  // columns {0, 1}, {2, 3}, {4}
  EXPECT_EQ(pairs.kv_rows, 64);
  EXPECT_EQ(pairs.threads, 384);
  EXPECT_LE(pairs.shared_bytes, 227 * 1024);
  EXPECT_EQ(array_of(pairs, "kKeyTileOrder"), (std::vector<int>{0, 1, 2}));  // 9, 5 and 1 blocks
  const auto single = generate_attention_backward(masks, {128, 64, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90a");
  EXPECT_EQ(single.key_tiles, 5);
  EXPECT_EQ(single.kv_rows, 128);
  EXPECT_EQ(array_of(single, "kKeyTileOrder"), (std::vector<int>{0, 1, 2, 3, 4}));
  const auto mma = generate_attention_backward(masks, {64, 128, DType::bf16, QkvOrder::bshd, true, ""}, "sm_90");
  EXPECT_FALSE(mma.tma);
  EXPECT_EQ(mma.key_tiles, 5);
}

// The footprint by its definition: for runs of 2^i consecutive tiles of the launch order, the
// other-side blocks a run touches at each place along it (every tile when fewer), the count that
// 9 places in 10 stay within; up to a run of every tile or of 7/8 of the blocks.
std::vector<std::int64_t> footprint_by_definition(const Layout& mask, bool by_column, const std::vector<int>& order,
                                                  int tile, int block) {
  const std::int64_t other = by_column ? mask.rows() : mask.cols();
  const std::int64_t tiles = static_cast<std::int64_t>(order.size());
  std::vector<std::int64_t> out;
  for (std::int64_t w = 1;; w *= 2) {
    std::vector<std::int64_t> places;
    for (std::int64_t first = 0; first + std::min(w, tiles) <= tiles; ++first) {
      std::vector<bool> seen(other, false);
      for (std::int64_t i = first; i < first + std::min(w, tiles); ++i)
        for (const auto& [r, c] : mask.coords()) {
          const std::int64_t line = by_column ? c : r;
          if (line * block >= order[i] * tile && line * block < (order[i] + 1) * tile) seen[by_column ? r : c] = true;
        }
      places.push_back(std::count(seen.begin(), seen.end(), true));
    }
    std::sort(places.begin(), places.end());
    out.push_back(places[(places.size() - 1) * 9 / 10]);
    if (w >= tiles || 8 * out.back() >= 7 * other) break;
  }
  return out;
}

TEST(AttentionGenerator, FootprintCountsTheBlocksARunOfTilesTouches) {
  const AttentionOptions b64{64, 64, DType::bf16, QkvOrder::bshd, false, ""};
  const Layout window = layouts::sliding_window(32, 4, false), causal = layouts::causal(32);
  const Layout global = layouts::unite(layouts::sliding_window(32, 3), layouts::global_tokens(32, 2));
  for (const Layout* mask : {&window, &causal, &global})
    for (const char* arch : {"sm_80", "sm_90a"}) {
      // in the kernel's blocks: of 128 where the mask runs on tiles of 128 (CoarseMasks)
      const Layout coarse = coarse_masks({*mask}).masks[0];
      const auto f = generate_attention_forward({*mask}, b64, arch);
      const Layout& fm = f.block == 128 ? coarse : *mask;
      EXPECT_EQ(f.footprint.blocks, footprint_by_definition(fm, false, array_of(f, "kTileOrder"), f.block, f.block))
          << arch;
      const auto g = generate_attention_backward({*mask}, b64, arch);
      const Layout& gm = g.block == 128 ? coarse : *mask;
      const int tile = static_cast<int>(32 * 64 / g.key_tiles);  // 128 on sm_90a: two columns a tile
      EXPECT_EQ(g.footprint.blocks, footprint_by_definition(gm, true, array_of(g, "kKeyTileOrder"), tile, g.block))
          << arch;
      EXPECT_EQ(g.footprint.lines, gm.rows());
    }
  // a bidirectional window of 7 blocks: a run of t query tiles reads about t + 6 key blocks
  const auto w = generate_attention_forward({window}, b64, "sm_80").footprint;
  ASSERT_GE(w.blocks.size(), 5u);
  EXPECT_EQ(w.blocks[0], 7);
  EXPECT_EQ(w.of(1), 7);
  EXPECT_EQ(w.of(3), w.blocks[2]);
  EXPECT_LE(w.blocks[3], 8 + 6 + 2);
  EXPECT_EQ(w.of(1000), w.blocks.back()) << "a run of more than every tile is every tile";
  // a causal mask's runs read nearly every block: bands as if each pair streamed its whole tensors
  const auto c = generate_attention_forward({causal}, b64, "sm_80").footprint;
  EXPECT_EQ(c.blocks.size(), 1u);
  EXPECT_GE(c.blocks[0], 28);
  EXPECT_EQ(c.of(2), 32);
  // the window's two global rows and columns touch every block, but 9 runs in 10 do not
  const auto gb = generate_attention_backward({global}, b64, "sm_80").footprint;
  EXPECT_LE(gb.blocks[0], 3 + 2);
  EXPECT_EQ(gb.of(1 << 20), 32);
}

// The tables are not in the source: masks of one shape and block count whose blocks sit elsewhere
// (columns permuted) have one source per kernel, and a long sequence's source stays small.
TEST(AttentionGenerator, MasksOfOneShapeShareTheSource) {
  const Layout a = layouts::bigbird(32, 2, 1, 3, 11);
  std::vector<int> perm(32);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
  std::vector<std::pair<std::int64_t, std::int64_t>> moved;
  for (const auto& [r, c] : a.coords()) moved.push_back({r, perm[c]});
  const std::vector<Layout> one = {a}, other = {Layout::from_coords(32, 32, moved)};
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (int block : {32, 64, 128}) {
      const AttentionOptions o{block, 128, DType::bf16, QkvOrder::bshd, false, arch};
      const auto f = generate_attention_forward(one, o, arch), g = generate_attention_forward(other, o, arch);
      EXPECT_EQ(f.source, g.source) << f.label;
      EXPECT_NE(tables_digest(f.tables), tables_digest(g.tables)) << f.label;
      const auto fb = generate_attention_backward(one, o, arch), gb = generate_attention_backward(other, o, arch);
      EXPECT_EQ(fb.source, gb.source) << fb.label;
      EXPECT_NE(tables_digest(fb.tables), tables_digest(gb.tables)) << fb.label;
      const auto fo = generate_attention_ops(one, o), go = generate_attention_ops(other, o);
      EXPECT_EQ(fo.source, go.source) << fo.label;
      EXPECT_NE(tables_digest(fo.tables), tables_digest(go.tables)) << fo.label;
    }
  // causal at 1024 blocks a side: 524800 blocks, none of them in the source
  const auto long_causal = generate_attention_forward({layouts::causal(1024)}, {}, "sm_80");
  EXPECT_EQ(array_of(long_causal, "kKeys").size(), 524800u);
  EXPECT_LT(long_causal.source.size(), 4096u);
}

// The kernels' sources hold no sequence length: causal masks of 16 to 512 blocks a side (1024 to
// 65536 positions at b = 64) give one forward, one backward and one decomposed-ops source per
// configuration, their block counts in kDims.
// (Block-64 masks on Hopper run on tiles of 128 where most of those are live, CoarseMasks: there one
// source serves every length whose masks run coarse, another every length whose do not.)
TEST(AttentionGenerator, OneSourceServesEverySequenceLength) {
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (int block : {32, 64, 128}) {
      const AttentionOptions o{block, 64, DType::f16, QkvOrder::bhsd, true, arch};
      const auto f = generate_attention_forward({layouts::causal(16)}, o, arch);
      const auto b = generate_attention_backward({layouts::causal(15)}, o, arch);  // odd: not coarse
      const auto ops = generate_attention_ops({layouts::causal(16)}, o);
      const bool coarse = block == 64 && arch == "sm_90a";  // at 100 and 180 blocks (0.99 live), not 16
      ASSERT_EQ(f.block, block);
      const auto f_coarse = generate_attention_forward({layouts::causal(64)}, o, arch);
      const auto b_coarse = generate_attention_backward({layouts::causal(64)}, o, arch);
      ASSERT_EQ(f_coarse.block, coarse ? 128 : block);
      ASSERT_EQ(b_coarse.block, coarse ? 128 : block);
      for (std::int64_t n : {17, 100, 180}) {  // 180: the ops' most score tiles at b = 128
        const std::vector<Layout> masks = {layouts::causal(n), layouts::causal(n)};  // per head
        const std::vector<Layout> one = {masks[0]};
        const auto g = generate_attention_forward(one, o, arch);
        const bool here = coarse && n % 2 == 0;
        const std::int64_t lines = here ? n / 2 : n;  // the kernel's blocks
        EXPECT_EQ(g.source, (here ? f_coarse : f).source) << g.label << " at " << n << " blocks";
        EXPECT_EQ(array_of(g, "kDims"), (std::vector<int>{static_cast<int>(lines), static_cast<int>(lines)}));
        EXPECT_EQ(array_of(g, "kKeys").size(), static_cast<std::size_t>(lines * (lines + 1) / 2));
        const auto gb = generate_attention_backward(one, o, arch);
        EXPECT_EQ(gb.source, (here ? b_coarse : b).source) << gb.label << " at " << n << " blocks";
        EXPECT_EQ(array_of(gb, "kDims"), (std::vector<int>{static_cast<int>(lines), static_cast<int>(lines)}));
        const auto go = generate_attention_ops(one, o);
        EXPECT_EQ(go.source, ops.source) << go.label << " at " << n << " blocks";
        EXPECT_EQ(array_of(go, "kDims"),
                  (std::vector<int>{static_cast<int>(n), static_cast<int>(n), static_cast<int>(n * (n + 1) / 2)}));
        // the number of masks is still part of the source
        EXPECT_NE(generate_attention_forward(masks, o, arch).source, f.source) << g.label;
      }
    }
}

TEST(AttentionGenerator, RefusesWhatTheKernelDoesNotTake) {
  const std::vector<Layout> one = {layouts::causal(4)};
  EXPECT_THROW(generate_attention_forward({}, {}, "sm_80"), Error);
  EXPECT_THROW(generate_attention_forward({layouts::causal(4), layouts::causal(5)}, {}, "sm_80"), Error);
  EXPECT_THROW(generate_attention_forward(one, {48, 64, DType::bf16, QkvOrder::bshd, false, ""}, "sm_90a"), Error);
  EXPECT_THROW(generate_attention_forward(one, {64, 96, DType::bf16, QkvOrder::bshd, false, ""}, "sm_90a"), Error);
  EXPECT_THROW(generate_attention_forward(one, {64, 64, DType::f32, QkvOrder::bshd, false, ""}, "sm_90a"), Error);
}

// Grouped-query attention: the group is part of every kernel's source and label (K and V are
// indexed by key/value head), the backward gains its fourth kernel; per-head masks come in whole
// groups.
TEST(AttentionGenerator, KeyValueGroupShapesTheSource) {
  const std::vector<Layout> one = {layouts::causal(4)};
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (int block : {32, 128}) {
      AttentionOptions o{block, 64, DType::bf16, QkvOrder::bshd, true, arch};
      const auto f1 = generate_attention_forward(one, o, arch);
      const auto b1 = generate_attention_backward(one, o, arch);
      const auto ops1 = generate_attention_ops(one, o);
      EXPECT_TRUE(b1.dkv.empty());
      EXPECT_NE(f1.source.find("kKvGroup = 1 }"), std::string::npos) << f1.label;
      o.kv_group = 4;
      const auto f4 = generate_attention_forward(one, o, arch);
      const auto b4 = generate_attention_backward(one, o, arch);
      const auto ops4 = generate_attention_ops(one, o);
      EXPECT_NE(f4.source.find("kKvGroup = 4 }"), std::string::npos) << f4.label;
      EXPECT_NE(b4.source.find("kKvGroup = 4 }"), std::string::npos) << b4.label;
      EXPECT_NE(ops4.source.find("kKvGroup = 4 }"), std::string::npos) << ops4.label;
      EXPECT_EQ(f4.label, f1.label.substr(0, f1.label.find("-causal")) + "-causal-g4" + (f1.tma ? "-tma" : ""));
      EXPECT_NE(b4.label, b1.label);
      EXPECT_NE(ops4.label, ops1.label);
      EXPECT_EQ(b4.dkv, "bsjit::kernels::attention_backward_dkv_kernel<bsjit_generated::Config>");
      EXPECT_EQ(b4.key_rows16, 4 * block / 16);
      EXPECT_EQ(f4.tma, f1.tma) << "the group does not change the kernel chosen";
    }
  const std::vector<Layout> three = {layouts::causal(4), layouts::causal(4), layouts::causal(4)};
  EXPECT_THROW(generate_attention_forward(three, {64, 64, DType::bf16, QkvOrder::bshd, false, "", 2}, "sm_80"), Error);
  EXPECT_NO_THROW(generate_attention_forward(three, {64, 64, DType::bf16, QkvOrder::bshd, false, "", 3}, "sm_80"));
  EXPECT_THROW(generate_attention_backward(one, {64, 64, DType::bf16, QkvOrder::bshd, false, "", 0}, "sm_80"), Error);
  EXPECT_THROW(generate_attention_ops(one, {64, 64, DType::bf16, QkvOrder::bshd, false, "", -2}), Error);
}

TEST(AttentionGenerator, EveryVariantCompiles) {
  const std::vector<Layout> masks = {layouts::sliding_window(4, 2), layouts::causal(4)};
  std::vector<AttentionOptions> all;
  int i = 0;
  for (int block : {16, 32, 64, 128})
    for (int d : {32, 64, 128})
      for (DType dt : {DType::bf16, DType::f16}) {
        // orders, causality and targets alternate to keep the count down; every shape of the
        // Hopper kernel (block and head dim ≥ 64) for sm_90a
        const bool hopper = block >= 64 && d >= 64;
        all.push_back({block, d, dt, i % 2 ? QkvOrder::bhsd : QkvOrder::bshd, i % 3 == 0,
                       hopper || i % 2 == 0 ? "sm_90a" : "sm_80"});
        ++i;
      }
  // grouped-query attention (2 query heads per key/value head) on each kind of kernel: mma.sync at
  // blocks 32 and 64, Hopper at 64 and 128
  for (const auto& [block, arch] : {std::pair{32, "sm_80"}, {64, "sm_80"}, {64, "sm_90a"}, {128, "sm_90a"}})
    all.push_back({block, 128, DType::bf16, block == 64 ? QkvOrder::bshd : QkvOrder::bhsd, block == 128, arch, 2});
  auto run = [&](AttentionOptions o) -> std::string {
    try {
      std::string failure;
      const auto g = generate_attention_forward(masks, o, o.arch);
      failure += compile_failures(g, g.name_expression, o.arch);
      // the backward's three kernels from one source, four with a key/value group
      const auto bw = generate_attention_backward(masks, o, o.arch);
      if (bw.tma != g.tma) return bw.label + ": the backward's Hopper choice differs from the forward's";
      if (bw.dkv.empty() != (o.kv_group == 1)) return bw.label + ": a dkv kernel without a group, or none with one";
      for (const auto& name : {bw.prep, bw.main, bw.dq, bw.dkv})
        if (!name.empty()) failure += compile_failures(bw, name, o.arch);
      // the decomposed ops' five kernels, for every block size and head dim (bf16)
      if (o.dtype == DType::bf16) {
        const auto ops = generate_attention_ops(masks, o);
        for (const auto& name : {ops.scores, ops.softmax, ops.softmax_grad, ops.probs_v, ops.probs_t})
          failure += compile_failures(ops, name, o.arch);
      }
      return failure;
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  std::vector<std::string> failures(all.size());
  runtime::parallel_for(all.size(), 2, [&](std::size_t i) { failures[i] = run(all[i]); });  // CI machines: 2 cores
  for (const auto& f : failures)
    if (!f.empty()) ADD_FAILURE() << f;
  EXPECT_EQ(all.size(), 28u);
  EXPECT_EQ(std::count_if(all.begin(), all.end(),
                          [&](const AttentionOptions& o) { return generate_attention_forward(masks, o, o.arch).tma; }),
            10);
}


// A [blocks, blocks] mask of every block but `holes` of them, spread over the tiles of 2 × 2 blocks.
Layout nearly_dense(std::int64_t blocks, std::int64_t holes) {
  std::vector<std::uint8_t> dense(blocks * blocks, 1);
  for (std::int64_t i = 0; i < holes; ++i) dense[(i * 37 + 5) % (blocks * blocks)] = 0;
  return Layout::from_dense(blocks, blocks, dense);
}

TEST(AttentionGenerator, Block64MasksRunOnTilesOf128WhereMostlyLive) {
  std::mt19937_64 rng(64);
  std::vector<std::uint8_t> random(12 * 12);
  for (auto& x : random) x = rng() % 4 == 0;
  const std::vector<Layout> fine = {layouts::causal(12), layouts::sliding_window(12, 3),
                                    Layout::from_dense(12, 12, random), nearly_dense(12, 7)};
  // the tiles and their quadrants give back every mask's blocks, and nothing else
  const CoarseMasks c = coarse_masks(fine);
  ASSERT_EQ(c.masks.size(), fine.size());
  std::int64_t blocks = 0, tiles = 0;
  for (std::size_t m = 0; m < fine.size(); ++m) {
    ASSERT_EQ(c.masks[m].rows(), 6);
    ASSERT_EQ(c.quadrants[m].size(), c.masks[m].coords().size());
    std::vector<std::pair<std::int32_t, std::int32_t>> back;
    for (std::size_t e = 0; e < c.quadrants[m].size(); ++e) {
      const auto [r, col] = c.masks[m].coords()[e];
      EXPECT_GT(c.quadrants[m][e], 0) << "a tile with no block";
      EXPECT_LT(c.quadrants[m][e], 16);
      for (int bit = 0; bit < 4; ++bit)
        if (c.quadrants[m][e] >> bit & 1) back.push_back({2 * r + bit / 2, 2 * col + bit % 2});
    }
    auto want = fine[m].coords();
    std::sort(back.begin(), back.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(back, want) << "mask " << m;
    blocks += fine[m].blocks(), tiles += c.masks[m].blocks();
  }
  EXPECT_DOUBLE_EQ(c.live, static_cast<double>(blocks) / (4.0 * static_cast<double>(tiles)));
  EXPECT_THROW(coarse_masks({layouts::causal(5)}), Error);

  // where a pass coarsens: block 64 on Hopper, even masks, live enough for the pass's gain
  const AttentionOptions d128{64, 128, DType::bf16, QkvOrder::bshd, true, ""};
  const std::vector<Layout> causal = {layouts::causal(16)};  // 136 blocks on 36 tiles: 0.94 live
  for (bool backward : {false, true}) {
    EXPECT_TRUE(coarse_attention(causal, d128, "sm_90a", backward)) << backward;
    EXPECT_FALSE(coarse_attention(causal, d128, "sm_90", backward)) << "the mma.sync kernels";
    EXPECT_FALSE(coarse_attention({layouts::causal(15)}, d128, "sm_90a", backward)) << "odd";
    EXPECT_FALSE(coarse_attention({Layout::from_dense(12, 12, random)}, d128, "sm_90a", backward)) << "sparse tiles";
    auto d64 = d128;
    d64.head_dim = 64;  // forward gain 1.1: 0.94 live is not enough, 0.99 is; backward 1.29: both are
    EXPECT_EQ(coarse_attention(causal, d64, "sm_90a", backward).has_value(), backward);
    EXPECT_TRUE(coarse_attention({nearly_dense(16, 2)}, d64, "sm_90a", backward)) << backward;
    auto b128 = d128;
    b128.block = 128;
    EXPECT_FALSE(coarse_attention(causal, b128, "sm_90a", backward));
  }

  // the kernels: block 128, each list entry's quadrants beside it
  const auto f = generate_attention_forward(causal, d128, "sm_90a");
  EXPECT_EQ(f.block, 128);
  EXPECT_TRUE(f.tma);
  EXPECT_EQ(f.q_rows, 128);
  EXPECT_EQ(f.seq_q, 16 * 64);
  EXPECT_EQ(f.query_tiles, 8);
  EXPECT_NE(f.label.find("-quadrants"), std::string::npos) << f.label;
  const auto keys = array_of(f, "kKeys"), quads = array_of(f, "kKeyQuadrants");
  ASSERT_EQ(keys.size(), 36u);  // the 8 × 8 causal tiles
  ASSERT_EQ(quads.size(), keys.size());
  const auto starts = array_of(f, "kRowStart");
  for (int r = 0; r < 8; ++r)
    for (int e = starts[r]; e < starts[r + 1]; ++e)
      EXPECT_EQ(quads[e], keys[e] == r ? 0b1101 : 0b1111) << r << " " << keys[e];  // the diagonal: (0, 1) dead
  const auto b = generate_attention_backward(causal, d128, "sm_90a");
  EXPECT_EQ(b.block, 128);
  EXPECT_EQ(b.key_tiles, 8);
  EXPECT_EQ(b.kv_rows, 128);
  const auto queries = array_of(b, "kQueryBlocks"), by_column = array_of(b, "kQueryQuadrants");
  const auto col_starts = array_of(b, "kColStart");
  ASSERT_EQ(by_column.size(), queries.size());
  for (int col = 0; col < 8; ++col)
    for (int e = col_starts[col]; e < col_starts[col + 1]; ++e)
      EXPECT_EQ(by_column[e], queries[e] == col ? 0b1101 : 0b1111) << col << " " << queries[e];
  // a pass that does not coarsen keeps block 64
  auto d64 = d128;
  d64.head_dim = 64;
  EXPECT_EQ(generate_attention_forward(causal, d64, "sm_90a").block, 64);
  EXPECT_EQ(generate_attention_forward(causal, d64, "sm_90a").label.find("-quadrants"), std::string::npos);
}

// The quadrant-masked kernels compile for sm_90a at both head dims, dtypes and orders, causal or
// not, with a key/value group, and hold their tables.
TEST(AttentionGenerator, QuadrantKernelsCompile) {
  const std::vector<Layout> two = {nearly_dense(8, 1), layouts::causal(8)};  // 0.95 live
  const std::vector<Layout> one = {nearly_dense(8, 1)};                     // 0.98: enough at head dim 64
  const std::vector<std::pair<std::vector<Layout>, AttentionOptions>> all = {
      {two, {64, 128, DType::bf16, QkvOrder::bshd, true, "sm_90a"}},
      {two, {64, 128, DType::f16, QkvOrder::bhsd, false, "sm_90a"}},
      {two, {64, 128, DType::bf16, QkvOrder::bhsd, true, "sm_90a", 2}},
      {one, {64, 64, DType::bf16, QkvOrder::bhsd, true, "sm_90a"}},
      {one, {64, 64, DType::f16, QkvOrder::bshd, false, "sm_90a"}}};
  std::vector<std::string> failures(all.size());
  runtime::parallel_for(all.size(), 2, [&](std::size_t i) {
    const auto& [masks, o] = all[i];
    const auto f = generate_attention_forward(masks, o, o.arch);
    const auto b = generate_attention_backward(masks, o, o.arch);
    if (f.block != 128 || b.block != 128) {
      failures[i] = f.label + ": not on tiles of 128";
      return;
    }
    failures[i] += compile_failures(f, f.name_expression, o.arch);
    for (const auto& name : {b.prep, b.main, b.dq, b.dkv})
      if (!name.empty()) failures[i] += compile_failures(b, name, o.arch);
  });
  for (const auto& f : failures)
    if (!f.empty()) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace bsjit::generator
