// Pictures of sparsity patterns: a layout, or a set of attention masks side by side, as SVG, one cell
// per block (`bsjit inspect --image`). Past 512 blocks a side, each cell covers a square of blocks
// and its shade is the fraction of them stored.
#pragma once

#include <string>
#include <vector>

#include "bsjit/layout.hpp"

namespace bsjit::tools {

// The SVG of the masks side by side (one per head), each titled with its shape and block count.
std::string layout_svg(const std::vector<Layout>& masks, const std::string& title);

}  // namespace bsjit::tools
