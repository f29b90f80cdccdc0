#include "suite_layouts.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "bsjit/error.hpp"

namespace bsjit::bench {

namespace {

// Output block column k holds per_column(k) blocks at random rows (a shuffle of the rows per column).
template <class PerColumn>
Layout random_columns(std::int64_t rows, std::int64_t cols, std::mt19937_64& rng, PerColumn per_column) {
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  std::vector<std::int64_t> perm(rows);
  for (std::int64_t k = 0; k < cols; ++k) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t j = 0; j < per_column(k); ++j) coords.emplace_back(perm[j], k);
  }
  return Layout::from_coords(rows, cols, coords);
}

// P of a kind "skewP" (1 .. 99), or 0 for any other kind.
int skew_percent(const std::string& kind) {
  if (kind.size() < 5 || kind.size() > 6 || kind.rfind("skew", 0) != 0) return 0;
  int p = 0;
  for (char c : kind.substr(4)) {
    if (c < '0' || c > '9') return 0;
    p = 10 * p + (c - '0');
  }
  return p;
}

}  // namespace

Layout balanced_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  const std::int64_t per = std::max<std::int64_t>(1, std::llround(d * rows));
  return random_columns(rows, cols, rng, [&](std::int64_t) { return per; });
}

Layout bernoulli_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  std::bernoulli_distribution bern(d);
  std::vector<std::uint8_t> m(rows * cols);
  for (auto& v : m) v = bern(rng);
  return Layout::from_dense(rows, cols, m);
}

Layout skewed_layout(std::int64_t rows, std::int64_t cols, double d, double spread, std::mt19937_64& rng) {
  const auto count = [&](double f) { return std::clamp<std::int64_t>(std::llround(d * rows * f), 1, rows); };
  const std::int64_t longer = count(1 + spread), shorter = count(1 - spread);
  return random_columns(rows, cols, rng, [&](std::int64_t k) { return k % 2 == 0 ? longer : shorter; });
}

Layout power_law_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  std::vector<std::int64_t> rank(cols);
  std::iota(rank.begin(), rank.end(), 1);
  std::shuffle(rank.begin(), rank.end(), rng);
  // lengths s / rank clamped to [1, rows]; s found by bisection so that they sum to d · rows · cols
  const double target = d * static_cast<double>(rows) * static_cast<double>(cols);
  const auto length = [&](double s, std::int64_t r) {
    return std::clamp<std::int64_t>(std::llround(s / static_cast<double>(r)), 1, rows);
  };
  const auto total = [&](double s) {
    double t = 0;
    for (std::int64_t r : rank) t += static_cast<double>(length(s, r));
    return t;
  };
  double lo = 0, hi = static_cast<double>(rows) * static_cast<double>(cols);
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < target ? lo : hi) = mid;
  }
  return random_columns(rows, cols, rng, [&](std::int64_t k) { return length(hi, rank[k]); });
}

Layout small_world_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  const std::int64_t per = std::clamp<std::int64_t>(std::llround(d * rows), 1, rows);
  std::bernoulli_distribution rewire(0.1);
  std::uniform_int_distribution<std::int64_t> any_row(0, rows - 1);
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  std::vector<std::uint8_t> taken(rows);
  for (std::int64_t k = 0; k < cols; ++k) {
    std::fill(taken.begin(), taken.end(), 0);
    const std::int64_t first = k * rows / cols - per / 2;
    std::vector<std::int64_t> column;
    for (std::int64_t j = 0; j < per; ++j) column.push_back(((first + j) % rows + rows) % rows);
    for (std::int64_t r : column) taken[r] = 1;
    for (std::int64_t& r : column) {
      if (per == rows || !rewire(rng)) continue;
      std::int64_t to = any_row(rng);
      while (taken[to]) to = any_row(rng);
      taken[r] = 0, taken[to] = 1, r = to;
    }
    for (std::int64_t r : column) coords.emplace_back(r, k);
  }
  return Layout::from_coords(rows, cols, coords);
}

Layout draw_layout(const std::string& kind, std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  if (kind == "balanced") return balanced_layout(rows, cols, d, rng);
  if (kind == "bernoulli") return bernoulli_layout(rows, cols, d, rng);
  if (kind == "powerlaw") return power_law_layout(rows, cols, d, rng);
  if (kind == "smallworld") return small_world_layout(rows, cols, d, rng);
  if (const int p = skew_percent(kind); p > 0) return skewed_layout(rows, cols, d, p / 100.0, rng);
  throw Error("unknown layout kind '" + kind +
              "' (balanced, bernoulli, powerlaw, smallworld, or skewP with P in 1..99: skew20)");
}

std::vector<Layout> table_layouts(std::int64_t features, const Grid& table, const Grid& cells) {
  std::map<std::tuple<std::string, int, double>, Layout> drawn;
  auto draw = [&](const std::string& kind, int b, double d, std::mt19937_64& rng) {
    return draw_layout(kind, features / b, features / b, d, rng);
  };
  std::mt19937_64 rng(42);
  for (const auto& kind : table.kinds)
    for (int b : table.blocks)
      for (double d : table.densities) drawn.emplace(std::tuple{kind, b, d}, draw(kind, b, d, rng));
  std::vector<Layout> out;
  for (const auto& kind : cells.kinds)
    for (int b : cells.blocks)
      for (double d : cells.densities) {
        auto it = drawn.find({kind, b, d});
        if (it == drawn.end()) {
          std::mt19937_64 own(43 + 1000003ull * static_cast<unsigned>(b) +
                              static_cast<unsigned long long>(std::llround(d * 1e6)) * 2 +
                              (kind == "balanced"    ? 0
                               : kind == "bernoulli" ? 1
                                                     : (2ull + skew_percent(kind)) * 0x9E3779B9ull));
          it = drawn.emplace(std::tuple{kind, b, d}, draw(kind, b, d, own)).first;
        }
        out.push_back(it->second);
      }
  return out;
}

std::string to_string(const LayerClass& layer) {
  return std::to_string(layer.c) + "x" + std::to_string(layer.k) + "/" + layer.kind + "/" + std::to_string(layer.n);
}

LayerClass parse_layer_class(const std::string& text) {
  const auto fail = [&](const std::string& why) -> LayerClass {
    throw Error("layer class '" + text + "': " + why + " (expected CxK/kind/N, e.g. 12288x12288/powerlaw/8192)");
  };
  const std::size_t x = text.find('x'), s1 = text.find('/'), s2 = text.rfind('/');
  if (x == std::string::npos || s1 == std::string::npos || s1 == s2 || x > s1) return fail("not of that form");
  const auto number = [&](const std::string& digits, const char* what) {
    if (digits.empty() || digits.size() > 7 || digits.find_first_not_of("0123456789") != std::string::npos)
      fail(std::string(what) + " is not a positive integer under 10^7");
    const std::int64_t v = std::stoll(digits);
    if (v <= 0) fail(std::string(what) + " must be positive");
    return v;
  };
  LayerClass layer{number(text.substr(0, x), "C"), number(text.substr(x + 1, s1 - x - 1), "K"),
                   number(text.substr(s2 + 1), "N"), text.substr(s1 + 1, s2 - s1 - 1)};
  try {
    std::mt19937_64 rng(0);
    draw_layout(layer.kind, 1, 1, 1.0, rng);  // throws for an unknown kind
  } catch (const Error& e) {
    return fail(e.what());
  }
  return layer;
}

std::vector<LayerClass> default_layer_classes() {
  std::vector<LayerClass> out{{4096, 4096, 8192, "balanced"}, {8192, 8192, 8192, "balanced"}};
  for (const char* kind : {"balanced", "bernoulli", "powerlaw", "smallworld"})
    out.push_back({12288, 12288, 8192, kind});
  for (const char* kind : {"balanced", "powerlaw"}) out.push_back({4096, 11008, 8192, kind});
  out.push_back({11008, 4096, 8192, "balanced"});
  for (std::int64_t n : {1024, 2048, 32768}) out.push_back({12288, 12288, n, "balanced"});
  out.push_back({4096, 4096, 32768, "balanced"});
  return out;
}

Layout layer_layout(const LayerClass& layer, int b, double d) {
  if (b <= 0 || layer.c % b != 0 || layer.k % b != 0)
    throw Error(
        fmt::format("layer {}: block {} does not divide C = {} and K = {}", to_string(layer), b, layer.c, layer.k));
  std::uint64_t seed = 0xC2B2AE3D27D4EB4Full;
  for (char ch : to_string(layer)) seed = (seed ^ static_cast<unsigned char>(ch)) * 0x100000001B3ull;
  std::mt19937_64 rng(seed ^ (static_cast<std::uint64_t>(b) << 32) ^ static_cast<std::uint64_t>(std::llround(d * 1e6)));
  return draw_layout(layer.kind, layer.c / b, layer.k / b, d, rng);
}

}  // namespace bsjit::bench
