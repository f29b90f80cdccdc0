// The tables of the grouped (b = 16, 32) and paired (b = 64) Hopper forward / backward-data kernels
// (templates/bsjit/matmul_grouped.cuh and matmul_paired.cuh): output block columns grouped by the
// input blocks they share, pairs by their shared blocks, the groups in a balanced order.
#include "matmul_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include "bsjit/error.hpp"

namespace bsjit::generator {
namespace {

// The chunks of `sub` input blocks that per_out's columns reach: the last one's index plus one.
int chunk_count(const Columns& per_out, int sub) {
  int count = 0;
  for (const auto& entries : per_out)
    for (auto [in, w] : entries) count = std::max(count, in / sub + 1);
  return count;
}

}  // namespace

// Tables of the grouped and paired kernels (templates/bsjit/matmul_grouped.cuh says what each
// holds). per_out[j] lists output block column j's (input block, W block index) pairs; order lists
// the columns as they are grouped, `columns` at a time (-1: none), the first half of a group the
// first consumer's (the first column of a pair), the rest the second one's (`consumers` halves); a
// group's steps are the chunks of `sub` input blocks (64 reduction indices) holding a block of its
// columns, in three classes (blocks of both halves, of the first only, of the second only), chunks
// ascending within a class (CTAs running together, on the same rows of X, then read X in about the
// same order). Sets grid_x to the number of groups and sub_fill to the fraction of the sub-blocks
// that a consumer computes (those of the steps of its classes) where one of its slots holds a block.
std::string grouped_tables(const Columns& per_out, const std::vector<int>& order, int columns, int sub, int consumers,
                           std::int64_t& grid_x, double& sub_fill, DeviceTables& tables) {
  const int record = 2 + sub * columns, positions = static_cast<int>(order.size());
  const int groups = (positions + columns - 1) / columns, per = columns / consumers;
  std::vector<int> group_steps, steps, group_columns;
  std::int64_t computed = 0, filled = 0;  // sub-blocks computed by a consumer, those holding its blocks
  // a group's chunks: chunk → W block per slot j · columns + c (-1: none), the chunks it touched
  std::vector<std::vector<int>> chunk_slots(chunk_count(per_out, sub));
  std::vector<int> touched;
  for (int gi = 0; gi < groups; ++gi) {
    for (int c = 0; c < columns; ++c) {
      const int at = gi * columns + c, col = at < positions ? order[at] : -1;
      group_columns.push_back(col);
      if (col < 0) continue;
      for (auto [in, wblock] : per_out[col]) {
        auto& slots = chunk_slots[in / sub];
        if (slots.empty()) slots.assign(sub * columns, -1), touched.push_back(in / sub);
        slots[in % sub * columns + c] = wblock;
      }
    }
    std::sort(touched.begin(), touched.end());  // the chunks ascending
    std::vector<int> by_class[3];
    for (int chunk : touched) {
      const std::vector<int>& slots = chunk_slots[chunk];
      unsigned pattern = 0;
      bool held[2] = {false, false};
      for (int i = 0; i < sub * columns; ++i)
        if (slots[i] >= 0) pattern |= 1u << i, held[i % columns / per] = true;
      for (int h = 0; h < consumers; ++h) {
        if (!held[h]) continue;
        computed += sub;
        for (int j = 0; j < sub; ++j)
          filled += std::any_of(slots.begin() + j * columns + h * per, slots.begin() + j * columns + (h + 1) * per,
                                [](int w) { return w >= 0; });
      }
      auto& out = by_class[held[0] && held[1] ? 0 : held[0] ? 1 : 2];
      out.push_back(chunk), out.push_back(static_cast<int>(pattern));
      for (int i = 0; i < sub * columns; ++i) out.push_back(std::max(slots[i], 0));
    }
    for (int chunk : touched) chunk_slots[chunk].clear();
    touched.clear();
    for (auto& c : by_class) {
      group_steps.push_back(static_cast<int>(steps.size()) / record);
      steps.insert(steps.end(), c.begin(), c.end());
    }
  }
  group_steps.push_back(static_cast<int>(steps.size()) / record);
  grid_x = groups;
  sub_fill = computed > 0 ? static_cast<double>(filled) / static_cast<double>(computed) : 1.0;
  std::string text = fmt::format(
      "// Groups of {} output block columns. Group g's steps: kGroupSteps[3g] up to kGroupSteps[3g + 3], in\n"
      "// classes from kGroupSteps[3g + k] (blocks of both consumers, of the first only, of the second\n"
      "// only). Step s is kSteps[s·{} ...]: chunk of 64 reduction indices, pattern (bit j·{} + c: sub-block\n"
      "// j of column c holds a block), the W block of each slot. kGroupColumns: the output block column\n"
      "// of each column of each group (-1: none).\n",
      columns, record, columns);
  text += add_table(tables, "kGroupSteps", std::move(group_steps));
  text += add_table(tables, "kSteps", std::move(steps));
  text += add_table(tables, "kGroupColumns", std::move(group_columns));
  return text;
}

// Output block columns in pairs for the paired kernel: in column order, each column not yet paired
// takes the unpaired column sharing most input blocks with it (ties: the lowest index; an odd last
// column is alone, its partner -1). Returns the columns pair by pair. Counted on suite W's balanced
// layouts, such pairs share 62-64% of their blocks at d = 0.5 and 33-48% at d ≤ 0.25, so that a
// step stream of X tiles and W blocks moves 0.75 of the unpaired kernel's bytes at b = 64, d = 0.5,
// 0.83-0.88 at lower densities (docs/PERFORMANCE.md). Costs the sum over input blocks of the
// squared number of columns holding them.
std::vector<int> pair_columns(const Columns& per_out) {
  const int columns = static_cast<int>(per_out.size());
  int in_blocks = 0;
  for (const auto& entries : per_out)
    for (auto [in, w] : entries) in_blocks = std::max(in_blocks, in + 1);
  std::vector<std::vector<int>> holders(in_blocks);  // input block → the columns holding it
  for (int c = 0; c < columns; ++c)
    for (auto [in, w] : per_out[c]) holders[in].push_back(c);
  std::vector<int> order, shared(columns, 0), touched;
  std::vector<bool> paired(columns, false);
  for (int c = 0; c < columns; ++c) {
    if (paired[c]) continue;
    paired[c] = true;
    for (auto [in, w] : per_out[c])
      for (int o : holders[in])
        if (!paired[o] && shared[o]++ == 0) touched.push_back(o);
    int best = -1;
    for (int o : touched)
      if (best < 0 || shared[o] > shared[best] || (shared[o] == shared[best] && o < best)) best = o;
    for (int o : touched) shared[o] = 0;
    touched.clear();
    if (best < 0)  // nothing shared: the next unpaired column
      for (int o = c + 1; o < columns && best < 0; ++o)
        if (!paired[o]) best = o;
    if (best >= 0) paired[best] = true;
    order.push_back(c), order.push_back(best);
  }
  return order;
}

// Output block columns in groups of `columns` for the grouped kernel, so that a group's columns
// share chunks (sub input blocks, 64 reduction indices: a step copies one X tile per chunk): each
// group starts at the lowest column not yet grouped and adds, one at a time, the column that brings
// the fewest chunks the group does not hold yet (ties: the lowest index). Counted on suite W's
// balanced layouts, this takes the steps per block from 0.46 to 0.40 (b = 32, d = 0.25), 0.72 to
// 0.57 (d = 0.1), 0.30 to 0.25 (b = 16, d = 0.1) and 0.50 to 0.38 (d = 0.05) against groups of
// consecutive columns. The search scans every column per pick; past 4096 columns the groups are
// consecutive. Returns the columns group by group, -1 filling the last.
std::vector<int> group_by_chunks(const Columns& per_out, int columns, int sub) {
  const int n = static_cast<int>(per_out.size());
  std::vector<int> order;
  if (n > 4096) {
    for (int c = 0; c < n; ++c) order.push_back(c);
  } else {
    std::vector<std::vector<int>> chunks(n);  // each column's chunks, ascending
    int chunk_count = 0;
    for (int c = 0; c < n; ++c) {
      for (auto [in, w] : per_out[c])
        if (chunks[c].empty() || chunks[c].back() != in / sub) chunks[c].push_back(in / sub);
      if (!chunks[c].empty()) chunk_count = std::max(chunk_count, chunks[c].back() + 1);
    }
    std::vector<std::vector<int>> holders(chunk_count);  // chunk → the columns holding it
    for (int c = 0; c < n; ++c)
      for (int x : chunks[c]) holders[x].push_back(c);
    std::vector<int> extra(n);  // chunks of column c the group being built does not hold
    for (int c = 0; c < n; ++c) extra[c] = static_cast<int>(chunks[c].size());
    std::vector<bool> grouped(n, false), held(chunk_count, false);
    std::vector<int> group_chunks;
    auto add = [&](int c) {
      grouped[c] = true;
      order.push_back(c);
      for (int x : chunks[c])
        if (!held[x]) {
          held[x] = true, group_chunks.push_back(x);
          for (int o : holders[x]) --extra[o];
        }
    };
    for (int start = 0; start < n; ++start) {
      if (grouped[start]) continue;
      add(start);
      for (int size = 1; size < columns; ++size) {
        int best = -1;
        for (int o = start + 1; o < n; ++o)
          if (!grouped[o] && (best < 0 || extra[o] < extra[best])) best = o;
        if (best < 0) break;
        add(best);
      }
      for (int x : group_chunks) {
        held[x] = false;
        for (int o : holders[x]) ++extra[o];
      }
      group_chunks.clear();
    }
  }
  while (order.size() % columns != 0) order.push_back(-1);
  return order;
}

namespace {

// The steps of each group of `columns` positions of `order`: the chunks holding a block of its columns.
std::vector<std::int64_t> group_chunk_counts(const Columns& per_out, const std::vector<int>& order, int columns,
                                             int sub) {
  std::vector<int> seen(chunk_count(per_out, sub), -1);  // the last group that counted the chunk
  std::vector<std::int64_t> counts;
  for (std::size_t g = 0; g < order.size(); g += columns) {
    std::int64_t& n = counts.emplace_back(0);
    for (std::size_t c = g; c < g + columns && c < order.size(); ++c)
      if (order[c] >= 0)
        for (auto [in, w] : per_out[order[c]])
          if (int& s = seen[in / sub]; s != static_cast<int>(g)) s = static_cast<int>(g), ++n;
  }
  return counts;
}

}  // namespace

// The steps of the grouped kernel's tables for groups in `order`: per group, its chunks.
std::int64_t grouped_steps(const Columns& per_out, const std::vector<int>& order, int columns, int sub) {
  const auto counts = group_chunk_counts(per_out, order, columns, sub);
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

// A grouped kernel's column order (groups of `columns` consecutive positions) with its groups in
// balanced_order by their steps (chunks of sub input blocks holding a block of the group).
std::vector<int> balanced_groups(const Columns& per_out, const std::vector<int>& order, int columns, int sub,
                                 std::int64_t ctas) {
  const std::vector<std::int64_t> steps = group_chunk_counts(per_out, order, columns, sub);
  std::vector<int> out;  // whole groups: a short last group's padding (-1) moves with it
  for (int gi : balanced_order(steps, ctas, false))
    for (std::size_t c = 0; c < static_cast<std::size_t>(columns); ++c) {
      const std::size_t at = gi * columns + c;
      out.push_back(at < order.size() ? order[at] : -1);
    }
  return out;
}

// The share of the blocks that pair_columns' pairs hold both of (their steps copy one X tile for
// two W blocks).
double paired_share(const Columns& per_out) {
  const std::vector<int> order = pair_columns(per_out);
  std::int64_t blocks = 0, shared = 0;
  for (std::size_t p = 0; p + 1 < order.size(); p += 2) {
    blocks += static_cast<std::int64_t>(per_out[order[p]].size());
    if (order[p + 1] < 0) continue;
    blocks += static_cast<std::int64_t>(per_out[order[p + 1]].size());
    std::set<int> first;
    for (auto [in, w] : per_out[order[p]]) first.insert(in);
    for (auto [in, w] : per_out[order[p + 1]]) shared += 2 * static_cast<std::int64_t>(first.count(in));
  }
  return blocks == 0 ? 0.0 : static_cast<double>(shared) / static_cast<double>(blocks);
}

}  // namespace bsjit::generator
