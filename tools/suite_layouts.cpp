#include "suite_layouts.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

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

Layout draw_layout(const std::string& kind, std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  if (kind == "balanced") return balanced_layout(rows, cols, d, rng);
  if (kind == "bernoulli") return bernoulli_layout(rows, cols, d, rng);
  if (const int p = skew_percent(kind); p > 0) return skewed_layout(rows, cols, d, p / 100.0, rng);
  throw Error("unknown layout kind '" + kind + "' (balanced, bernoulli, or skewP with P in 1..99: skew20)");
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

}  // namespace bsjit::bench
