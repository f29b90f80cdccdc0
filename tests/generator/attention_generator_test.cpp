// The attention generator: its per-row key tables rebuild the masks, options it cannot serve are
// refused, and every kernel variant compiles with NVRTC for sm_80 and sm_90a.
#include "attention_generator.hpp"

#include <gtest/gtest.h>

#include <future>
#include <regex>

#include "bsjit/attention_layouts.hpp"
#include "bsjit/error.hpp"
#include "runtime/compiler.hpp"

namespace bsjit::generator {
namespace {

// The integers of the C array named `name` in source.
std::vector<int> array_of(const std::string& source, const std::string& name) {
  const auto at = source.find(name + "[] = {");
  EXPECT_NE(at, std::string::npos) << name;
  const auto end = source.find("};", at);
  std::vector<int> out;
  const std::string body = source.substr(at + name.size() + 6, end - at - name.size() - 6);
  const std::regex number("-?[0-9]+");
  for (std::sregex_iterator it(body.begin(), body.end(), number), last; it != last; ++it) out.push_back(std::stoi(it->str()));
  return out;
}

TEST(AttentionGenerator, TablesRebuildEveryHeadsMask) {
  const std::vector<Layout> masks = {layouts::causal(6), layouts::bigbird(6, 1, 1, 1, 7),
                                     Layout::from_coords(6, 6, {{0, 5}, {3, 1}, {3, 2}})};  // empty rows
  const auto g = generate_attention_forward(masks, {64, 64, DType::bf16, QkvOrder::bshd, true, ""});
  const auto starts = array_of(g.source, "kRowStart"), keys = array_of(g.source, "kKeys");
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
  EXPECT_NE(g.source.find("kCausal = true"), std::string::npos);
}

TEST(AttentionGenerator, RefusesWhatTheKernelDoesNotTake) {
  const std::vector<Layout> one = {layouts::causal(4)};
  EXPECT_THROW(generate_attention_forward({}, {}), Error);
  EXPECT_THROW(generate_attention_forward({layouts::causal(4), layouts::causal(5)}, {}), Error);
  EXPECT_THROW(generate_attention_forward(one, {48, 64, DType::bf16, QkvOrder::bshd, false, ""}), Error);
  EXPECT_THROW(generate_attention_forward(one, {64, 96, DType::bf16, QkvOrder::bshd, false, ""}), Error);
  EXPECT_THROW(generate_attention_forward(one, {64, 64, DType::f32, QkvOrder::bshd, false, ""}), Error);
}

TEST(AttentionGenerator, EveryVariantCompiles) {
  const std::vector<Layout> masks = {layouts::sliding_window(4, 2), layouts::causal(4)};
  std::vector<AttentionOptions> all;
  int i = 0;
  for (int block : {16, 32, 64, 128})
    for (int d : {32, 64, 128})
      for (DType dt : {DType::bf16, DType::f16}) {
        // orders, causality and targets alternate to keep the count down
        all.push_back({block, d, dt, i % 2 ? QkvOrder::bhsd : QkvOrder::bshd, i % 3 == 0, i % 2 ? "sm_80" : "sm_90a"});
        ++i;
      }
  std::vector<std::future<std::string>> pending;
  std::vector<std::string> failures;
  auto run = [&](AttentionOptions o) -> std::string {
    try {
      const auto g = generate_attention_forward(masks, o);
      const auto k = runtime::compile(g.source, g.name_expression, g.label, o.arch);
      return k.cubin.size() > 64 ? "" : g.label + ": cubin too small";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  for (std::size_t next = 0; next < all.size() || !pending.empty();) {
    while (next < all.size() && pending.size() < 2) pending.push_back(std::async(std::launch::async, run, all[next++]));
    auto r = pending.front().get();
    pending.erase(pending.begin());
    if (!r.empty()) failures.push_back(r);
  }
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(all.size(), 24u);
}

}  // namespace
}  // namespace bsjit::generator
