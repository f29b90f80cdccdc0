// The layouts of the benchmark's suites (../shared/BENCH.md): balanced random (every block row of
// Wᵀ holding exactly round(d · rows) blocks) and Bernoulli(d), each cell's drawn as the whole table
// draws it, whichever cells a run selects; on request (`-k skew20`) columns of two lengths, for the
// choices the generator makes by how uneven a layout's columns are; and the column distributions of
// trained and designed layers (power-law, small-world) for the layers suite (suite_layers.hpp).
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

// Output block column lengths drawn from a power law (Zipf over a random ranking of the columns,
// exponent 1: the longest columns hold over ten times the shortest, as magnitude pruning leaves some
// output features dense and most sparse), scaled so the layout holds about d · rows · cols blocks
// (each column 1 to rows), at random rows.
Layout power_law_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng);

// A small-world layout (Watts–Strogatz on the block grid): output block column k holds the
// round(d · rows) block rows nearest its place on the diagonal (k · rows / cols, wrapping), each
// moved to a random row with probability 0.1: mostly local connections, a few long ones.
Layout small_world_layout(std::int64_t rows, std::int64_t cols, double d, std::mt19937_64& rng);

// The layout of kind "balanced", "bernoulli", "powerlaw", "smallworld" or "skewP" (skewed_layout,
// spread P / 100, P in 1 .. 99), rows × cols at density d; another kind throws bsjit::Error.
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

// A class of layers of the layers suite (`bsjit-bench --suite layers`): X [n, c], W [c, k] at a
// layout kind, so that the kernels' choices are measured away from suite W's one shape.
struct LayerClass {
  std::int64_t c, k, n;
  std::string kind;
  bool operator==(const LayerClass&) const = default;
};

// "CxK/kind/N" (12288x12288/powerlaw/8192), and back; parse_layer_class throws bsjit::Error naming
// what is wrong.
std::string to_string(const LayerClass& layer);
LayerClass parse_layer_class(const std::string& text);

// The layers suite's classes: suite W's (4096x4096/balanced/8192, the reference of every cell),
// larger square layers (8192, 12288), a 7B model's MLP (4096 × 11008 and back), Bernoulli,
// power-law and small-world columns at 12288 and 4096 × 11008, and N from 1024 to 32768.
std::vector<LayerClass> default_layer_classes();

// The layout of a class at block b and density d, from a stream seeded by the class and cell (the
// same in every run); throws bsjit::Error where b does not divide the features.
Layout layer_layout(const LayerClass& layer, int b, double d);

}  // namespace bsjit::bench
