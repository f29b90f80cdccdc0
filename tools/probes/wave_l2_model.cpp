// A model of the L2 traffic of the grouped forward's persistent wave (dsd_grouped_kernel, b ≤ 32):
// the generator's own column groups and order, CTA p taking tiles p, p + P, ... (group fastest),
// each step reading one X tile (BM rows × 64 features) and its W blocks through an LRU cache of
// the L2's size. Each CTA's steps take 1 + cv·z time (z normal, per step) times its own speed,
// 1 + spread·z (per CTA: SMs that run a little slower all the time); --lead k holds a CTA at its
// round r until every CTA has done round r - k (kernels::WaveGate). Prints the DRAM bytes read,
// the L2 hit rate and the time in steps. docs/PERFORMANCE.md, "The long-N cells profiled".
//   g++ -O2 -std=c++20 -Igenerator -Iinclude -Itools -I. tools/probes/wave_l2_model.cpp
//       tools/suite_layouts.cpp -Lbuild -lbsjit -Wl,-rpath,$PWD/build -lfmt -o wave_l2_model
//   ./wave_l2_model C N b d [l2_MiB=50] [cv=0.3] [spread=0.03] [lead=0]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <queue>
#include <random>
#include <unordered_map>
#include <vector>

#include "matmul_generator.hpp"
#include "matmul_plan.hpp"
#include "suite_layouts.hpp"

using namespace bsjit;
using namespace bsjit::generator;

namespace {

struct Lru {
  std::int64_t capacity = 0, used = 0, missed = 0, hit = 0;
  std::list<std::pair<std::uint64_t, std::int64_t>> order;  // most recent first
  std::unordered_map<std::uint64_t, decltype(order)::iterator> where;
  void read(std::uint64_t key, std::int64_t bytes) {
    if (auto it = where.find(key); it != where.end()) {
      hit += bytes;
      order.splice(order.begin(), order, it->second);
      return;
    }
    missed += bytes;
    order.emplace_front(key, bytes);
    where[key] = order.begin();
    for (used += bytes; used > capacity; order.pop_back()) {
      used -= order.back().second;
      where.erase(order.back().first);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s C N b d [l2_MiB] [cv] [spread] [lead]\n", argv[0]);
    return 2;
  }
  const std::int64_t features = std::atol(argv[1]), n = std::atol(argv[2]);
  const int b = std::atoi(argv[3]);
  const double d = std::atof(argv[4]), l2_mib = argc > 5 ? std::atof(argv[5]) : 50.0;
  const double cv = argc > 6 ? std::atof(argv[6]) : 0.3, spread = argc > 7 ? std::atof(argv[7]) : 0.03;
  const long lead = argc > 8 ? std::atol(argv[8]) : 0;
  std::mt19937_64 rng(1);
  const Layout layout = bench::balanced_layout(features / b, features / b, d, rng);
  MatMulSpec spec;
  spec.op = Op::forward, spec.block = b, spec.dtype = DType::bf16, spec.wgmma = true;
  const TileConfig t = choose_tiles(spec);
  if (t.columns <= 0) {
    std::fprintf(stderr, "b = %d: not the grouped kernel\n", b);
    return 1;
  }
  const long ctas = resident_ctas(t, kDefaultSms);
  const int sub = 64 / b;
  Columns per_out(layout.cols());
  for (std::int64_t i = 0; i < layout.blocks(); ++i) {
    const auto [r, c] = layout.block_coord(i);
    per_out[c].push_back({static_cast<int>(r), static_cast<int>(i)});
  }
  for (auto& column : per_out) std::sort(column.begin(), column.end());
  const std::vector<int> order =
      balanced_groups(per_out, group_by_chunks(per_out, t.columns, sub), t.columns, sub, ctas);
  const long groups = static_cast<long>(order.size()) / t.columns;
  std::vector<std::vector<std::pair<int, std::vector<int>>>> steps(groups);  // per group: (chunk, W blocks)
  for (long g = 0; g < groups; ++g) {
    std::map<int, std::vector<int>> chunks;
    for (int c = 0; c < t.columns; ++c)
      if (const int column = order[g * t.columns + c]; column >= 0)
        for (auto [in, w] : per_out[column]) chunks[in / sub].push_back(w);
    for (auto& [chunk, blocks] : chunks) steps[g].push_back({chunk, blocks});
  }
  const long row_tiles = (n + t.bm - 1) / t.bm, tiles = row_tiles * groups;
  Lru l2;
  l2.capacity = static_cast<std::int64_t>(l2_mib * 1048576);
  std::mt19937_64 noise(7);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<double> speed(ctas);
  for (double& s : speed) s = std::max(0.5, 1.0 + spread * z(noise));
  struct Cta {
    long tile;
    std::size_t step;
    long done;  // rounds finished
  };
  std::vector<Cta> cta(ctas);
  for (long p = 0; p < ctas; ++p) cta[p] = {p, 0, 0};
  using Event = std::pair<double, long>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (long p = 0; p < ctas; ++p) events.push({0.0, p});
  double end = 0.0;
  const std::int64_t x_bytes = static_cast<std::int64_t>(t.bm) * 128, w_bytes = 2LL * b * b;
  while (!events.empty()) {
    const auto [now, p] = events.top();
    events.pop();
    Cta& c = cta[p];
    while (c.tile < tiles && c.step >= steps[c.tile % groups].size()) c.tile += ctas, c.step = 0, ++c.done;
    if (c.tile >= tiles) {
      c.done = tiles;  // never waited for again
      end = std::max(end, now);
      continue;
    }
    if (lead > 0 && c.step == 0) {
      long slowest = tiles;
      for (const Cta& o : cta) slowest = std::min(slowest, o.done);
      if (slowest < c.tile / ctas - lead) {
        events.push({now + 0.05, p});
        continue;
      }
    }
    const auto& [chunk, blocks] = steps[c.tile % groups][c.step++];
    l2.read((1ULL << 62) | (static_cast<std::uint64_t>(c.tile / groups) << 32) | static_cast<std::uint64_t>(chunk),
            x_bytes);
    for (int w : blocks) l2.read(static_cast<std::uint64_t>(w), w_bytes);
    events.push({now + speed[p] * std::max(0.2, 1.0 + cv * z(noise)), p});
  }
  std::printf("C = K = %ld, N = %ld, b = %d, d = %.2f: BM %d, %d columns a group, %ld groups, %ld CTAs\n",
              static_cast<long>(features), static_cast<long>(n), b, d, t.bm, t.columns, groups, ctas);
  std::printf("DRAM read %.2f GB (X once %.2f GB, W once %.3f GB), L2 hit rate %.1f%%, time %.0f steps\n",
              static_cast<double>(l2.missed) / 1e9, static_cast<double>(n) * static_cast<double>(features) * 2 / 1e9,
              static_cast<double>(layout.blocks() * w_bytes) / 1e9,
              100.0 * static_cast<double>(l2.hit) / static_cast<double>(l2.hit + l2.missed), end);
}
