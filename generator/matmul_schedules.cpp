// How the persistent Hopper kernels deal their work to one wave of CTAs: unit orders for L2 and for
// balance, the small batch's split columns, the backward-weight split planes, and the SM count
// the schedules are planned for.
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

#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::generator {

// The order in which the Hopper backward-weight kernels take their units, for L2. CTA p of the P
// resident ones takes units p, p + P, ... (SddSchedule), so each wave of P consecutive units walks N
// together, and what one step of a wave reads from L2 (X's rows of the units' row positions, dY's
// of their column positions) is read from DRAM once if the CTAs stay within a few steps of one
// another. Over many waves they do not: in the order the tables come in (row positions ascending,
// then columns), a wave spans a few row positions and every column, so a step's rows of dY are a
// whole row of dY (24 KB at K = 12288), and CTAs some tens of steps apart need more than L2 holds.
// Instead the units go in super-rows of S row positions, column-major within one: a wave spans S
// row positions × about P / (S · u) of each one's u units, and the rows a step reads fall to
// S · x + K · P / (S · u) features (x: a unit's own features of X at its row position, K: the
// features of all columns), least at S = sqrt(K · P / (u · x)). C = K = 12288, b = 32, 64 × 512
// bands (u = 11 units a band, x = 64): S = 48, 6144 features a step against 13056. Measured (H100,
// bf16, d = 0.25, N = 8192, 2026-12-05; docs/PERFORMANCE.md "Backward-weight in an L2 order"):
// 12288² 78.9 -> 176.6 TFLOP/s at b = 32 and 165.7 -> 396.0 at b = 64, 4096 × 11008 ×1.9, suite
// W's 4096² ×1.08-1.18 at d = 0.25; at d = 0.1 b = 32 from level to 6% slower (three rounds).
// row[i], col[i]: unit i's row and column positions (block rows or bands, first block column).
std::vector<std::int64_t> l2_unit_order(const std::vector<std::int64_t>& row, const std::vector<std::int64_t>& col,
                                        double x_features, double k_features, double ctas) {
  const std::int64_t units = static_cast<std::int64_t>(row.size());
  std::vector<std::int64_t> order(units);
  std::iota(order.begin(), order.end(), 0);
  if (units == 0) return order;
  const std::int64_t rows = *std::max_element(row.begin(), row.end()) + 1;
  const double per_row = static_cast<double>(units) / static_cast<double>(rows);
  const std::int64_t s =
      std::clamp<std::int64_t>(std::llround(std::sqrt(k_features * ctas / (per_row * x_features))), 1, rows);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return std::tuple(row[a] / s, col[a], row[a]) < std::tuple(row[b] / s, col[b], row[b]);
  });
  return order;
}

// Puts units in `order`: each unit's `per_unit` entries of `table` (a table of units) moved with it.
void permute_units(std::vector<int>& table, std::int64_t per_unit, const std::vector<std::int64_t>& order) {
  std::vector<int> out;
  out.reserve(table.size());
  for (std::int64_t u : order) out.insert(out.end(), table.begin() + u * per_unit, table.begin() + (u + 1) * per_unit);
  table = std::move(out);
}

// The small batch's persistent order (N within one row tile: CTA p takes positions p, p + P, ...
// below units, and nothing else): the units dealt most steps first, each to the CTA with the least
// steps so far that has a position left (longest processing time first). balanced_order's classes
// are those of many row tiles, where every CTA meets every position of its class; with one row
// tile a CTA meets only its own positions: on Bernoulli(0.1) layouts of 16384 features at b = 64
// it left the busiest of one CTA per SM 58-61 blocks against a mean of 50-55 (Generator test).
// N = 64, C = K = 16384, d = 0.1 (H200, three rounds, TFLOP/s): b = 32 (its default, persistent,
// 8 stages) Bernoulli backward-data 97 -> 101-103.5, forward 101 -> 102-103, balanced within 1%;
// b = 64 with 8 stages on one CTA per SM, see layout_choice. With more row tiles (N up to
// kSmallBatchRows) the order still covers every unit. balanced_order deals its classes the same way.
// order[position] = unit.
std::vector<int> one_wave_order(const std::vector<std::int64_t>& steps, std::int64_t ctas) {
  const std::int64_t units = static_cast<std::int64_t>(steps.size());
  std::vector<int> order(units), by_steps(units);
  std::iota(by_steps.begin(), by_steps.end(), 0);
  std::stable_sort(by_steps.begin(), by_steps.end(), [&](int a, int b) { return steps[a] > steps[b]; });
  std::vector<std::int64_t> load(ctas, 0), taken(ctas, 0);
  for (int u : by_steps) {
    std::int64_t best = -1;
    for (std::int64_t p = 0; p < ctas; ++p)
      if (p + taken[p] * ctas < units && (best < 0 || load[p] < load[best])) best = p;
    order[best + ctas * taken[best]++] = u;
    load[best] += steps[u];
  }
  return order;
}

// The order of the units of a persistent dsd kernel (output block columns of dsd_tma_kernel, pairs
// or groups of them of the paired and grouped kernels): tile t is the unit at position t % units of
// row tile t / units, and CTA p of P takes tiles p, p + P, ..., so it meets the positions p + kP
// (mod units): with g = gcd(P, units), those of one class p mod g. Units of uneven steps
// (backward-data of a balanced layout, any op of a Bernoulli one, pairs sharing more or fewer
// blocks) load the classes, and so the CTAs, unevenly: simulated on suite W's b = 128 layouts, the
// busiest CTA has 1.07-1.34 times the mean work in order, 1.03 (the waves' rounding) with the
// units dealt most steps first, each to the class holding the fewest. Measured on suite W at
// b = 128 (balanced backward-data, TFLOP/s, in order → balanced): d = 0.5 682 → 719, d = 0.25
// 611 → 647, d = 0.1 348 → 472, d = 0.05 327 → 386; Bernoulli forward 667 → 715, 577 → 641,
// 447 → 542, 365 → 373.
// The CTAs of a class meet its positions in one cycle, each from its own phase (CTA p's i-th tile
// is at the class's position p / g + i · P / g, mod units / g). Dealt most steps first, the long units sit
// together, so the CTAs that start there fall behind the others, the wave spreads over more row
// tiles than L2 holds, and X (dY) is read from DRAM again: Nsight Compute, swapped kernel at b = 128,
// backward-data of the sweep's balanced layout at d = 0.05, 81.6 MB read (69 MB once), 74.1 MB with the
// cycle smoothed (89.0 MB in plain order). Suite W at b = 128, 64 and 32 on the layouts such a run
// drew then (not the full table's), two rounds (A/B in one call): b = 128 backward-data d = 0.05
// 362-365 → 383-387 TFLOP/s (+6%), Bernoulli b = 64 forward d = 0.05 276-279 → 296-297 (+7%),
// Bernoulli b = 128 backward-data d = 0.1 +1.5-1.8%, the rest within noise. On the full table's
// layouts, one run each (849d577 → 70b5640): b = 128 backward-data d = 0.05 385 → 382 (there the old
// order was not behind), Bernoulli b = 64 forward d = 0.05 308 → 322, b = 128 370 → 381.
// Only the TMA kernel's columns are smoothed: the paired kernel's backward-data at b = 64, d = 0.1
// lost 3.5% with it (both layouts), and the grouped kernel's cells moved within noise.
// order[position] = unit.
std::vector<int> balanced_order(const std::vector<std::int64_t>& steps, std::int64_t ctas, bool smooth) {
  const std::int64_t units = static_cast<std::int64_t>(steps.size());
  std::vector<int> order(units);
  if (units == 0) return order;
  const std::int64_t g = std::gcd(ctas, units), per_class = units / g;
  order = one_wave_order(steps, g);  // class c: positions c, c + g, ..., as a CTA's of one row tile
  if (!smooth) return order;
  // With `smooth`, each class's cycle (positions k, k + s, k + 2s, ... of the class, s = P / g mod
  // units / g) keeps its running steps near the straight line: at each, the unit that brings the
  // sum closest to that multiple of the class's mean.
  const std::int64_t stride = (ctas / g) % per_class;
  for (std::int64_t c = 0; c < g; ++c) {
    std::vector<int> left;
    std::int64_t total = 0, sum = 0;
    for (std::int64_t k = 0; k < per_class; ++k) left.push_back(order[c + g * k]), total += steps[order[c + g * k]];
    for (std::int64_t i = 0; i < per_class; ++i) {
      const double line = static_cast<double>(total) * static_cast<double>(i + 1) / static_cast<double>(per_class);
      const auto off = [&](int u) { return std::abs(static_cast<double>(sum + steps[u]) - line); };
      const auto it = std::min_element(left.begin(), left.end(), [&](int a, int b) { return off(a) < off(b); });
      order[c + g * (i * stride % per_class)] = *it;
      sum += steps[*it];
      left.erase(it);
    }
  }
  return order;
}

// The time a persistent dsd kernel takes with its CTAs paced (kernels::WaveGate: a CTA's producer
// starts round k once every CTA has issued round k - lead) over the time they take running free, on
// a model: tile t is the unit at position t % units of row tile t / units (unit_steps in position
// order), CTA p of P takes tiles p, p + P, ..., a tile costs its steps and one more (its epilogue),
// and a CTA's producer issues a round's last copy `stages` steps before its consumers end it. Where
// the units of a round differ (columns of a power-law layout, whose longest holds ten times the
// mean), a CTA that drew a long one holds every other back at the gate, where running free it only
// shifts its own later rounds. Simulated over two cycles of the positions (a CTA meets every
// position of its class once a cycle), at least 16 rounds.
double paced_slowdown(const std::vector<std::int64_t>& unit_steps, std::int64_t ctas, int lead, int stages) {
  const auto units = static_cast<std::int64_t>(unit_steps.size());
  if (units == 0 || ctas <= 0) return 1.0;
  const std::int64_t rounds = std::clamp<std::int64_t>(2 * units / std::gcd(ctas, units), 16, 1024);
  std::vector<double> end(ctas, 0.0), work(ctas, 0.0), issued(rounds, 0.0);
  for (std::int64_t k = 0; k < rounds; ++k) {
    const double gate = k >= lead ? issued[k - lead] : 0.0;
    for (std::int64_t p = 0; p < ctas; ++p) {
      const double cost = static_cast<double>(unit_steps[(p + k * ctas) % units]) + 1.0;
      end[p] = std::max(end[p], gate) + cost;
      work[p] += cost;
      issued[k] = std::max(issued[k], end[p] - std::min(cost, static_cast<double>(stages)));
    }
  }
  return *std::max_element(end.begin(), end.end()) / *std::max_element(work.begin(), work.end());
}

// The small batch's columns split (TileConfig::split): the layout's blocks, column j reading LUT
// entries offsets[j] .. offsets[j + 1], dealt to at most max_ctas CTAs (one wave) so that no CTA
// copies much more than the mean share. First whole columns, longest first, each to the CTA with
// the least work so far; then, while the busiest CTA holds more than the cap (the mean share times
// kSlack), the tail of its longest item (what it holds over the cap, at least a minimum piece, at
// most what the least busy CTA has room for, and leaving a minimum piece) moves to the least busy
// CTA: pieces only where a column would hold up the op, each piece's partials added by the
// column's last. Why: at N = 64 a CTA per column waits out its column's blocks at a rate a CTA
// reaches alone, so the longest column sets the time. N = 64, C = K = 16384, d = 0.1 (H200, one
// CTA per column): b = 64 forward 0.0205 ms on the balanced layout (every column 26 blocks)
// against 0.0223 on the Bernoulli one (14-39 blocks), and backward-data, whose columns are the
// balanced layout's rows (12-40), 0.0237; b = 32 0.0304 against 0.0350 and 0.0340 (24-76 blocks;
// 51 on average). Measured (sweep-small, balanced, ms, split / best unsplit): b = 64
// backward-data 0.0223 with 8 stages on one CTA per SM against 0.0234, but 0.0295 with 6 stages
// on two CTAs per SM (more pieces) and 0.0322 with 4 on three; forward (no column cut) 0.0211
// against 0.0200; b = 32 0.0341-0.0404 against 0.0303-0.0332. The pieces cost more than the
// balance gains (their epilogue's fence, arrival and reads of the other partials end the column
// late), so these shapes are tuning candidates, not the default.
SplitColumns split_columns(const std::vector<int>& offsets, std::int64_t max_ctas, std::int64_t block,
                           std::int64_t bm) {
  // A piece's partial costs a write and a read of bm × block fp32 (from L2): a piece copies at least
  // twice those bytes of W (b = 32: 16 blocks, b = 64: 8, b = 128: 4), a CTA at least twice that.
  // CTAs: one per column at least (as unsplit), up to a wave.
  constexpr double kSlack = 1.15;
  const std::int64_t columns = static_cast<std::int64_t>(offsets.size()) - 1, total = offsets.back();
  const std::int64_t min_piece = std::max<std::int64_t>(1, 2 * 2 * bm * block * 4 / (2 * block * block));
  SplitColumns out;
  out.ctas = std::clamp<std::int64_t>(std::max(columns, (total + 2 * min_piece - 1) / (2 * min_piece)), 1, max_ctas);
  const auto cap = std::max<std::int64_t>(
      2 * min_piece,
      static_cast<std::int64_t>(std::ceil(kSlack * static_cast<double>(total) / static_cast<double>(out.ctas))));
  struct Item {
    int column, begin, end;
  };
  std::vector<std::vector<Item>> held(out.ctas);
  std::set<std::pair<std::int64_t, std::int64_t>> loads;  // (blocks, CTA)
  for (std::int64_t p = 0; p < out.ctas; ++p) loads.insert({0, p});
  auto give = [&](std::int64_t p, std::int64_t load, const Item& item) {
    loads.erase({load, p});
    held[p].push_back(item);
    loads.insert({load + item.end - item.begin, p});
  };
  std::vector<int> order(columns);
  std::iota(order.begin(), order.end(), 0);
  auto length = [&](int j) { return offsets[j + 1] - offsets[j]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return length(a) > length(b); });
  for (int j : order) {
    const auto [load, p] = *loads.begin();
    give(p, load, {j, offsets[j], offsets[j + 1]});
  }
  while (true) {
    const auto [most, p] = *loads.rbegin();
    const auto [least, q] = *loads.begin();
    if (most <= cap) break;
    auto& mine = held[p];
    auto longest = std::max_element(mine.begin(), mine.end(),
                                    [](const Item& a, const Item& b) { return a.end - a.begin < b.end - b.begin; });
    const std::int64_t tail = std::min(std::max(most - cap, min_piece), cap - least);
    if (tail < min_piece || longest->end - longest->begin < tail + min_piece) break;
    const Item moved{longest->column, static_cast<int>(longest->end - tail), longest->end};
    longest->end = moved.begin;
    loads.erase({most, p});
    loads.insert({most - tail, p});
    give(q, least, moved);
  }
  // CTAs without an item go (each CTA's first item sits at its own index of the table, read at the
  // kernel's start beside its offsets); each CTA's pieces before its whole columns, so that their
  // partials are written, and added by the last, while later items run
  std::erase_if(held, [](const std::vector<Item>& mine) { return mine.empty(); });
  out.ctas = static_cast<std::int64_t>(held.size());
  // each split column's pieces in order, its split and planes numbered by column
  std::map<int, std::vector<std::pair<int, std::int64_t>>> pieces;  // column → (begin, CTA)
  for (std::int64_t p = 0; p < out.ctas; ++p)
    for (const Item& it : held[p]) pieces[it.column].push_back({it.begin, p});
  std::map<std::pair<int, int>, std::array<int, 4>> numbered;  // (column, begin) → split, first plane, piece, pieces
  for (auto& [column, ps] : pieces) {
    std::sort(ps.begin(), ps.end());
    const int q = static_cast<int>(ps.size());
    for (int i = 0; i < q; ++i) numbered[{column, ps[i].first}] = {q > 1 ? out.splits : -1, out.planes, i, q};
    if (q > 1) ++out.splits, out.planes += q;
  }
  std::vector<std::vector<std::array<int, 8>>> entries(held.size());  // the table's rows, per CTA
  for (std::size_t p = 0; p < held.size(); ++p) {
    for (const Item& it : held[p]) {
      const auto& n = numbered.at({it.column, it.begin});
      entries[p].push_back({it.column, it.begin, it.end, n[0], n[1], n[2], n[3], 0});
    }
    std::stable_partition(entries[p].begin(), entries[p].end(), [](const auto& e) { return e[3] >= 0; });
  }
  // tables of one size for every layout of the shape: the items padded to columns + 2 · max_ctas
  // (a moved tail holds at least min_piece blocks, so there are at most total / min_piece ≤
  // 2 · ctas of them), CTA p's first at p, the others from max_ctas on, CTA p's from cta_items[p]
  // to cta_items[p + 1] (max_ctas + 1 offsets)
  out.items.assign(8 * (columns + 2 * max_ctas), 0);
  std::int64_t rest = max_ctas;
  out.cta_items.push_back(static_cast<int>(rest));
  for (std::size_t p = 0; p < entries.size(); ++p) {
    for (std::size_t i = 0; i < entries[p].size(); ++i) {
      const std::int64_t at = i == 0 ? static_cast<std::int64_t>(p) : rest++;
      if (at >= columns + 2 * max_ctas)
        throw Error(fmt::format("internal: more split items than the table holds ({} columns)", columns));
      std::copy(entries[p][i].begin(), entries[p][i].end(), out.items.begin() + 8 * at);
    }
    out.cta_items.push_back(static_cast<int>(rest));
  }
  out.cta_items.resize(max_ctas + 1, out.cta_items.back());
  return out;
}

// CTAs of a pipelined shape one SM holds (227 KB of shared memory, 2048 threads).
std::int64_t ctas_per_sm(const TileConfig& t) {
  return std::clamp<std::int64_t>(227 * 1024 / t.shared_bytes, 1, 2048 / t.threads);
}

// CTAs of a persistent kernel on `sms` SMs: one wave of those the SMs hold.
std::int64_t resident_ctas(const TileConfig& t, std::int64_t sms) { return sms * ctas_per_sm(t); }

// Split support (the pieces' partials and their reduction: a third of the kernel's code and of its
// cold compile) only where the schedule splits on the H100 / H200's 132 SMs. NVRTC alone, 2-core
// machine, best of 3, plain kernels of suite W's Bernoulli d = 0.25 layouts (which do not split),
// with → without: tile128x256 at b = 16 537 → 328 ms, rows16 at b = 32 550 → 322, b = 128 363 → 168
// (2026-12-04). Elsewhere planes = 0, so that SddSchedule takes every unit whole on any GPU: on
// one of other SM counts the last wave may then run a few units alone.
std::int64_t sdd_kernel_planes(std::int64_t units, std::int64_t per_sm, std::int64_t sms) {
  const bool splits =
      units > 0 &&
      kernels::SddSchedule(static_cast<int>(units), static_cast<int>(sms * per_sm), INT_MAX, INT_MAX).q > 1;
  return splits ? sdd_planes(units, kMaxSms * per_sm) : 0;
}

std::int64_t sdd_planes(std::int64_t units, std::int64_t max_ctas) {
  int most = 0;
  for (std::int64_t p = 1; p <= max_ctas && units > 0; ++p)
    most =
        std::max(most, kernels::SddSchedule(static_cast<int>(units), static_cast<int>(p), INT_MAX, INT_MAX).planes());
  return most;
}

}  // namespace bsjit::generator
