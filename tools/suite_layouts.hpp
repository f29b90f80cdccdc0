// The layouts of the benchmark's suites (../shared/BENCH.md): balanced random (every block row of
// Wᵀ holding exactly round(d · rows) blocks) and Bernoulli(d), each cell's drawn as the whole table
// draws it, whichever cells a run selects; on request (`-k skew20`) columns of two lengths, for the
// choices the generator makes by how uneven a layout's columns are.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bsjit/layout.hpp"

namespace bsjit::bench {

// Every output block column k (a block row of Wᵀ) holds exactly round(d·rows) blocks (at least
// one) at random rows, so cuSPARSE Blocked-ELL needs no padding.
Layout balanced_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng);

// Every block present with probability d.
Layout bernoulli_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng);

// Output block columns of two lengths in turn, round(d·rows·(1 + spread)) and round(d·rows·(1 - spread))
// blocks (at least one, at most rows) at random rows: the longest holds about 1 + spread times the
// mean. spread in [0, 1).
Layout skewed_layout(std::int64_t rows, std::int64_t cols, double d, double spread, std::mt19937_64& rng);

// The layout of kind "balanced", "bernoulli" or "skewP" (skewed_layout, spread P / 100, P in 1 ..
// 99), rows × cols at density d; another kind throws bsjit::Error.
Layout draw_layout(const std::string& kind, std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng);

// A table's cells: every (layout kind, block size, density), in that order.
struct Grid {
  std::vector<std::string> kinds;  // "balanced", "bernoulli", "skew20", ...
  std::vector<int> blocks;
  std::vector<double> densities;
};

// The layouts of `cells` (features × features, in the cells' order): each the layout that the whole
// `table` draws for it from one random stream (seed 42) in the table's order, so that a run of some
// cells (`-b 128`) measures the layouts the full table measures; a cell outside the table draws its
// own from a stream seeded by the cell, the same in every run.
std::vector<Layout> table_layouts(std::int64_t features, const Grid& table, const Grid& cells);

}  // namespace bsjit::bench
