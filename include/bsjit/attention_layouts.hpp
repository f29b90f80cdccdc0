// Block masks of the common sparse-attention patterns, as Layouts over [query blocks, key blocks]
// (row i = query block i, column j = key block j). One layout per head, or one shared by all.
// `blocks` (a side) is 1 to 16384; outside that, and for other bad arguments, bsjit::Error.
//
// Example, causal(4), sliding_window(4, 2), global_tokens(4, 1) and the unite of those two:
//   causal(4)        sliding_window(4, 2)   global_tokens(4, 1) unite of the last two
//   1 0 0 0          1 0 0 0                1 0 0 0             1 0 0 0
//   1 1 0 0          1 1 0 0                1 0 0 0             1 1 0 0
//   1 1 1 0          0 1 1 0                1 0 0 0             1 1 1 0
//   1 1 1 1          0 0 1 1                1 0 0 0             1 0 1 1
#pragma once

#include <cstdint>

#include "bsjit/layout.hpp"

namespace bsjit::layouts {

// Key block j ≤ query block i.
Layout causal(std::int64_t blocks);

// |i - j| < window (causal: 0 ≤ i - j < window). window ≥ 1 block.
Layout sliding_window(std::int64_t blocks, std::int64_t window, bool causal = true);

// Every query attends the first `global` key blocks (causal: those at or before it); with
// bidirectional = true the first `global` query blocks also attend every key block (BigBird's
// global tokens).
Layout global_tokens(std::int64_t blocks, std::int64_t global, bool causal = true, bool bidirectional = false);

// Sparse Transformer (Child et al., 2019), "strided": causal, attend if i - j < stride (the local
// band) or (i - j) % stride == 0 (every stride-th block back).
Layout strided(std::int64_t blocks, std::int64_t stride);

// Sparse Transformer, "fixed": causal, attend if j is in i's chunk of `chunk` blocks, or j is one of
// the last `summary` blocks of its own chunk (the chunk's summary blocks).
Layout fixed(std::int64_t blocks, std::int64_t chunk, std::int64_t summary);

// BigBird (Zaheer et al., 2020): bidirectional window + global tokens (rows and columns) + `random`
// further key blocks per query row, drawn from the seed (the same seed gives the same layout).
Layout bigbird(std::int64_t blocks, std::int64_t window, std::int64_t global, std::int64_t random, std::uint64_t seed);

// The union of two layouts of one shape.
Layout unite(const Layout& a, const Layout& b);

}  // namespace bsjit::layouts
