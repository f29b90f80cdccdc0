#include "bsjit/attention_layouts.hpp"

#include <fmt/format.h>

#include <random>
#include <vector>

#include "bsjit/error.hpp"

namespace bsjit::layouts {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw Error("bsjit::layouts: " + what);
}

// A square layout whose block (i, j) is set where keep(i, j), of at most kMaxBlocks blocks a side:
// its dense mask then takes at most 256 MiB (16384 blocks of 128 are a sequence of 2M tokens).
constexpr std::int64_t kMaxBlocks = 16384;
void check_side(std::int64_t blocks) {
  require(blocks > 0 && blocks <= kMaxBlocks,
          fmt::format("blocks = {}; expected 1 to {} (query and key blocks a side)", blocks, kMaxBlocks));
}

template <class Keep>
Layout square(std::int64_t blocks, Keep keep) {
  check_side(blocks);
  std::vector<std::uint8_t> m(blocks * blocks);
  for (std::int64_t i = 0; i < blocks; ++i)
    for (std::int64_t j = 0; j < blocks; ++j) m[i * blocks + j] = keep(i, j) ? 1 : 0;
  return Layout::from_dense(blocks, blocks, m);
}

}  // namespace

Layout causal(std::int64_t blocks) {
  return square(blocks, [](std::int64_t i, std::int64_t j) { return j <= i; });
}

Layout sliding_window(std::int64_t blocks, std::int64_t window, bool is_causal) {
  require(window >= 1, fmt::format("window = {} blocks; expected at least 1", window));
  return square(blocks, [&](std::int64_t i, std::int64_t j) {
    const std::int64_t d = i - j;
    return is_causal ? (d >= 0 && d < window) : (d > -window && d < window);
  });
}

Layout global_tokens(std::int64_t blocks, std::int64_t global, bool is_causal, bool bidirectional) {
  check_side(blocks);
  require(global >= 1 && global <= blocks,
          fmt::format("global = {} blocks; expected 1 to {} (the number of blocks)", global, blocks));
  return square(blocks, [&](std::int64_t i, std::int64_t j) {
    const bool key = j < global && (!is_causal || j <= i);
    const bool query = bidirectional && i < global && (!is_causal || j <= i);
    return key || query;
  });
}

Layout strided(std::int64_t blocks, std::int64_t stride) {
  require(stride >= 1, fmt::format("stride = {} blocks; expected at least 1", stride));
  return square(blocks, [&](std::int64_t i, std::int64_t j) {
    const std::int64_t d = i - j;
    return d >= 0 && (d < stride || d % stride == 0);
  });
}

Layout fixed(std::int64_t blocks, std::int64_t chunk, std::int64_t summary) {
  require(chunk >= 1 && summary >= 1 && summary <= chunk,
          fmt::format("chunk = {}, summary = {}; expected 1 ≤ summary ≤ chunk", chunk, summary));
  return square(blocks, [&](std::int64_t i, std::int64_t j) {
    return j <= i && (j / chunk == i / chunk || j % chunk >= chunk - summary);
  });
}

Layout bigbird(std::int64_t blocks, std::int64_t window, std::int64_t global, std::int64_t random, std::uint64_t seed) {
  require(random >= 0, fmt::format("random = {}; expected ≥ 0", random));
  Layout base = unite(sliding_window(blocks, window, false), global_tokens(blocks, global, false, true));
  std::vector<std::uint8_t> m = base.dense();
  std::mt19937_64 rng(seed);
  for (std::int64_t i = global; i < blocks; ++i) {  // global rows already attend everything
    std::vector<std::int64_t> free;
    for (std::int64_t j = 0; j < blocks; ++j)
      if (!m[i * blocks + j]) free.push_back(j);
    for (std::int64_t r = 0; r < random && !free.empty(); ++r) {
      std::uniform_int_distribution<std::size_t> pick(0, free.size() - 1);
      std::size_t k = pick(rng);
      m[i * blocks + free[k]] = 1;
      free.erase(free.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return Layout::from_dense(blocks, blocks, m);
}

Layout unite(const Layout& a, const Layout& b) {
  require(a.rows() == b.rows() && a.cols() == b.cols(),
          fmt::format("cannot unite a [{}, {}] layout with a [{}, {}] one", a.rows(), a.cols(), b.rows(), b.cols()));
  std::vector<std::uint8_t> m = a.dense(), mb = b.dense();
  for (std::size_t i = 0; i < m.size(); ++i) m[i] |= mb[i];
  return Layout::from_dense(a.rows(), a.cols(), m);
}

}  // namespace bsjit::layouts
