#include "suite_layouts.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

namespace bsjit::bench {

Layout balanced_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  const std::int64_t per = std::max<std::int64_t>(1, std::llround(d * rows));
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  std::vector<std::int64_t> perm(rows);
  for (std::int64_t k = 0; k < cols; ++k) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t j = 0; j < per; ++j) coords.emplace_back(perm[j], k);
  }
  return Layout::from_coords(rows, cols, coords);
}

Layout bernoulli_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng) {
  std::bernoulli_distribution bern(d);
  std::vector<std::uint8_t> m(rows * cols);
  for (auto& v : m) v = bern(rng);
  return Layout::from_dense(rows, cols, m);
}

std::vector<Layout> table_layouts(std::int64_t features, const Grid& table, const Grid& cells) {
  std::map<std::tuple<std::string, int, double>, Layout> drawn;
  auto draw = [&](const std::string& kind, int b, double d, std::mt19937_64& rng) {
    return kind == "balanced" ? balanced_layout(features / b, features / b, d, rng)
                              : bernoulli_layout(features / b, features / b, d, rng);
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
                              (kind == "balanced" ? 0 : 1));
          it = drawn.emplace(std::tuple{kind, b, d}, draw(kind, b, d, own)).first;
        }
        out.push_back(it->second);
      }
  return out;
}

}  // namespace bsjit::bench
