// A model of the L2 traffic of a persistent Hopper kernel's wave, on the generator's own tables,
// through an LRU cache of the L2's size:
//   fwd: the grouped forward (dsd_grouped_kernel, b ≤ 32): CTA p takes tiles p, p + P, ... (column
//        group fastest), a step reading one X tile (BM rows × 64 features) and its W blocks; a
//        round is a tile.
//   tma: the TMA forward (dsd_tma_kernel, b ≥ 64): tile t the output column at position
//        t % units of row tile t / units, or with column groups of G positions (group g's tiles
//        together, column fastest within a row tile), a step reading one X slice (BM rows × 64
//        features) and 64 rows of the W block; a round is a tile.
//   bw:  backward-weight (sdd_rows_kernel, sdd_cols_kernel): CTA p takes units p, p + P, ..., each
//        over all of N, a step reading 64 rows of X at the unit's block rows and of dY at its block
//        columns; a round is 8 steps of a unit (the leftover units taken whole, unpaced).
// Each CTA's steps take 1 + cv·z time (z normal, per step) times its own speed, 1 + spread·z (per
// CTA: SMs that run a little slower all the time); lead k holds a CTA at its round r until every
// CTA has done round r - k (kernels::WaveGate; 0: no gate). Prints the DRAM bytes read, the L2 hit
// rate and the time in steps. docs/PERFORMANCE.md, "The long-N cells profiled".
//   g++ -O2 -std=c++20 -Igenerator -Iinclude -Itools -I. tools/probes/wave_l2_model.cpp
//       tools/suite_layouts.cpp -Lbuild -lbsjit -Wl,-rpath,$PWD/build -lfmt -o wave_l2_model
//   ./wave_l2_model fwd|tma|bw C N b d [l2_MiB=50] [cv=0.3] [spread=0.03] [lead=0] [layout=balanced]
//       [G=0: no column groups]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <list>
#include <map>
#include <queue>
#include <random>
#include <string>
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


// One step's reads: (key, bytes) pairs.
using Reads = std::vector<std::pair<std::uint64_t, std::int64_t>>;

// A CTA's work: items of steps, the rounds they make (0: unpaced), and the reads of step k of item i.
struct Work {
  long ctas = 0;
  std::vector<std::vector<long>> items;  // per CTA: its items
  std::function<long(long)> steps;       // steps of an item
  long round_steps = 0;                  // steps a round (0: an item)
  long paced_items = 0;                  // items every CTA has
  std::function<void(long, long, Reads&)> reads;
};

std::uint64_t key(int kind, long index, long step) {
  return (static_cast<std::uint64_t>(kind) << 60) | (static_cast<std::uint64_t>(index) << 32) |
         static_cast<std::uint64_t>(step);
}

void simulate(const Work& w, double l2_mib, double cv, double spread, long lead) {
  Lru l2;
  l2.capacity = static_cast<std::int64_t>(l2_mib * 1048576);
  std::mt19937_64 noise(7);
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<double> speed(w.ctas);
  for (double& s : speed) s = std::max(0.5, 1.0 + spread * z(noise));
  struct Cta {
    std::size_t item = 0;
    long step = 0, done = 0;  // rounds finished
  };
  std::vector<Cta> cta(w.ctas);
  using Event = std::pair<double, long>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (long p = 0; p < w.ctas; ++p) events.push({0.0, p});
  const auto round_of = [&](const Cta& c) {
    const long per_item = w.round_steps > 0 ? (w.steps(0) + w.round_steps - 1) / w.round_steps : 1;
    return static_cast<long>(c.item) * per_item + (w.round_steps > 0 ? c.step / w.round_steps : 0);
  };
  const long paced_rounds =
      w.paced_items * (w.round_steps > 0 ? (w.steps(0) + w.round_steps - 1) / w.round_steps : 1);
  double end = 0.0;
  Reads reads;
  while (!events.empty()) {
    const auto [now, p] = events.top();
    events.pop();
    Cta& c = cta[p];
    const auto& items = w.items[p];
    while (c.item < items.size() && c.step >= w.steps(items[c.item])) ++c.item, c.step = 0;
    if (c.item >= items.size()) {
      c.done = paced_rounds;  // never waited for again
      end = std::max(end, now);
      continue;
    }
    const long round = round_of(c);
    c.done = std::min(round, paced_rounds);
    const bool starts = w.round_steps > 0 ? c.step % w.round_steps == 0 : c.step == 0;
    if (lead > 0 && starts && round < paced_rounds) {
      long slowest = paced_rounds;
      for (const Cta& o : cta) slowest = std::min(slowest, o.done);
      if (slowest < round - lead) {
        events.push({now + 0.05, p});
        continue;
      }
    }
    reads.clear();
    w.reads(items[c.item], c.step++, reads);
    for (const auto& [k, bytes] : reads) l2.read(k, bytes);
    events.push({now + speed[p] * std::max(0.2, 1.0 + cv * z(noise)), p});
  }
  std::printf("DRAM read %.2f GB, L2 hit rate %.1f%%, time %.0f steps\n", static_cast<double>(l2.missed) / 1e9,
              100.0 * static_cast<double>(l2.hit) / static_cast<double>(l2.hit + l2.missed), end);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s fwd|bw C N b d [l2_MiB] [cv] [spread] [lead]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const std::int64_t features = std::atol(argv[2]), n = std::atol(argv[3]);
  const int b = std::atoi(argv[4]);
  const double d = std::atof(argv[5]), l2_mib = argc > 6 ? std::atof(argv[6]) : 50.0;
  const double cv = argc > 7 ? std::atof(argv[7]) : 0.3, spread = argc > 8 ? std::atof(argv[8]) : 0.03;
  const long lead = argc > 9 ? std::atol(argv[9]) : 0;
  const std::string kind = argc > 10 ? argv[10] : "balanced";
  const long group = argc > 11 ? std::atol(argv[11]) : 0;
  std::mt19937_64 rng(1);
  const std::int64_t blocks = features / b;
  const Layout layout = kind == "powerlaw"    ? bench::power_law_layout(blocks, blocks, d, rng)
                        : kind == "bernoulli" ? bench::bernoulli_layout(blocks, blocks, d, rng)
                                              : bench::balanced_layout(blocks, blocks, d, rng);
  MatMulSpec spec;
  spec.op = mode == "bw" ? Op::backward_weight : Op::forward, spec.block = b, spec.dtype = DType::bf16;
  spec.wgmma = true;
  const GeneratedSource g = generate_matmul(layout, spec);
  const TileConfig& t = g.tiles;
  const auto table = [&](const char* name) {
    for (const DeviceTable& tab : g.tables)
      if (tab.name == name) return tab.values;
    return std::vector<int>{};
  };
  Work w;
  w.ctas = resident_ctas(t, kDefaultSms);
  w.items.resize(w.ctas);
  std::vector<std::vector<std::pair<int, std::vector<int>>>> steps;  // fwd: per group, (chunk, W blocks)
  std::vector<std::vector<int>> x_blocks, dy_blocks;                 // bw: per unit
  long units = 0;
  const long row_steps = (n + 63) / 64;
  if (mode == "tma") {
    if (!t.tma || t.columns > 0 || t.paired) {
      std::fprintf(stderr, "%s: not the TMA kernel\n", g.label.c_str());
      return 1;
    }
    static std::vector<int> order, offsets, lut;
    order = table("kOutColumns"), offsets = table("kLutOffsets"), lut = table("kLut");
    const long positions = static_cast<long>(order.size()), row_tiles = (n + t.bm - 1) / t.bm;
    const long slices = std::max(1, b / 64), width = group > 0 ? group : positions, band = group < 0 ? -group : 0;
    units = positions * row_tiles;
    // tile → (position, row tile): groups of `width` positions, each over every row tile; or (G < 0)
    // bands of -G row tiles, each over every position, a position's row tiles together
    const auto place = [positions, row_tiles, width, band](long tile) {
      if (band > 0) {
        const long span = band * positions, bi = tile / span, r = tile - bi * span;
        const long h = std::min(band, row_tiles - bi * band);
        return std::pair<long, long>{r / h, bi * band + r % h};
      }
      const long span = width * row_tiles, gi = tile / span, r = tile - gi * span;
      const long w = std::min(width, positions - gi * width);
      return std::pair<long, long>{gi * width + r % w, r / w};
    };
    w.steps = [place, slices](long tile) {
      const long pos = place(tile).first;
      return static_cast<long>(offsets[pos + 1] - offsets[pos]) * slices;
    };
    const std::int64_t x_bytes = static_cast<std::int64_t>(t.bm) * 128, w_bytes = 128LL * b;
    w.reads = [place, slices, x_bytes, w_bytes](long tile, long k, Reads& r) {
      const auto [pos, row] = place(tile);
      const int entry = offsets[pos] + static_cast<int>(k / slices), slice = static_cast<int>(k % slices);
      r.push_back({key(1, row, lut[2 * entry] * 4 + slice), x_bytes});
      r.push_back({key(2, lut[2 * entry + 1], slice), w_bytes});
    };
  } else if (mode == "fwd") {
    if (t.columns <= 0) {
      std::fprintf(stderr, "%s: not the grouped kernel\n", g.label.c_str());
      return 1;
    }
    const int sub = 64 / b;
    Columns per_out(layout.cols());
    for (std::int64_t i = 0; i < layout.blocks(); ++i) {
      const auto [r, c] = layout.block_coord(i);
      per_out[c].push_back({static_cast<int>(r), static_cast<int>(i)});
    }
    for (auto& column : per_out) std::sort(column.begin(), column.end());
    const std::vector<int> order =
        balanced_groups(per_out, group_by_chunks(per_out, t.columns, sub), t.columns, sub, w.ctas);
    const long groups = static_cast<long>(order.size()) / t.columns;
    steps.resize(groups);
    for (long gi = 0; gi < groups; ++gi) {
      std::map<int, std::vector<int>> chunks;
      for (int c = 0; c < t.columns; ++c)
        if (const int column = order[gi * t.columns + c]; column >= 0)
          for (auto [in, blk] : per_out[column]) chunks[in / sub].push_back(blk);
      for (auto& [chunk, blocks] : chunks) steps[gi].push_back({chunk, blocks});
    }
    units = (n + t.bm - 1) / t.bm * groups;  // tiles
    w.steps = [&, groups](long tile) { return static_cast<long>(steps[tile % groups].size()); };
    const std::int64_t x_bytes = static_cast<std::int64_t>(t.bm) * 128, w_bytes = 2LL * b * b;
    w.reads = [&, groups, x_bytes, w_bytes](long tile, long k, Reads& r) {
      const auto& [chunk, blocks] = steps[tile % groups][k];
      r.push_back({key(1, tile / groups, chunk), x_bytes});
      for (int blk : blocks) r.push_back({key(2, blk, 0), w_bytes});
    };
  } else {
    const std::vector<int> coords = table("kCoords");
    if (t.row_blocks > 0 || t.col_blocks > 0) {
      const int per = 1 + (t.row_blocks > 0 ? t.row_blocks : t.col_blocks);
      const int band = t.row_blocks > 0 ? std::max(1, (t.band_rows > 0 ? t.band_rows : 64 / b)) : 1;
      units = static_cast<long>(coords.size()) / per;
      x_blocks.resize(units), dy_blocks.resize(units);
      for (long u = 0; u < units; ++u) {
        const int* e = coords.data() + u * per;
        if (t.row_blocks > 0) {  // a band of block rows × its block columns
          for (int j = 0; j < band; ++j) x_blocks[u].push_back(e[0] * band + j);
          for (int j = 1; j < per; ++j)
            if (e[j] >= 0) dy_blocks[u].push_back(e[j]);
        } else {  // a block column × its block rows
          dy_blocks[u].push_back(e[0]);
          for (int j = 1; j < per; ++j)
            if (e[j] >= 0) x_blocks[u].push_back(e[j]);
        }
      }
    } else {
      std::fprintf(stderr, "%s: not a row or column group kernel\n", g.label.c_str());
      return 1;
    }
    w.steps = [row_steps](long) { return row_steps; };
    w.round_steps = 8;
    const std::int64_t bytes = 128LL * std::min(b, 64);  // 64 rows × the block's features (a box of 64 at most)
    w.reads = [&, bytes](long u, long k, Reads& r) {
      for (int x : x_blocks[u])
        for (int f = 0; f < std::max(1, b / 64); ++f) r.push_back({key(1, x * 2 + f, k), bytes});
      for (int y : dy_blocks[u])
        for (int f = 0; f < std::max(1, b / 64); ++f) r.push_back({key(2, y * 2 + f, k), bytes});
    };
  }
  for (long i = 0; i < units; ++i) w.items[i % w.ctas].push_back(i);
  w.paced_items = units / w.ctas;
  const double once = static_cast<double>(n) * static_cast<double>(features) * 2 * (mode == "bw" ? 2 : 1);
  std::printf("%s, C = K = %ld, N = %ld, d = %.2f: %ld %s on %ld CTAs; X%s once %.2f GB\n", g.label.c_str(),
              static_cast<long>(features), static_cast<long>(n), d, units, mode == "bw" ? "units" : "tiles", w.ctas,
              mode == "bw" ? " and dY" : "", once / 1e9);
  simulate(w, l2_mib, cv, spread, lead);
}
