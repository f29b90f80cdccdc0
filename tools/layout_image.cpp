#include "layout_image.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

namespace bsjit::tools {
namespace {

constexpr std::int64_t kMaxCells = 512;  // a side: beyond, a cell covers a square of blocks
constexpr double kPanel = 512.0;         // a mask's side in pixels, the longer one
constexpr double kGap = 24.0, kHeader = 40.0;

}  // namespace

std::string layout_svg(const std::vector<Layout>& masks, const std::string& title) {
  std::string body;
  double x0 = kGap, height = 0;
  for (std::size_t m = 0; m < masks.size(); ++m) {
    const Layout& l = masks[m];
    const std::int64_t step = std::max<std::int64_t>(1, (std::max(l.rows(), l.cols()) + kMaxCells - 1) / kMaxCells);
    const std::int64_t cell_rows = (l.rows() + step - 1) / step, cell_cols = (l.cols() + step - 1) / step;
    const double cell = kPanel / static_cast<double>(std::max(cell_rows, cell_cols));
    const double w = cell * cell_cols, h = cell * cell_rows;
    std::vector<std::int64_t> count(cell_rows * cell_cols, 0);
    for (const auto& [r, c] : l.coords()) ++count[(r / step) * cell_cols + c / step];
    body += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="13">{}{} × {} blocks, {} stored{}</text>)"
                        "\n",
                        x0, kHeader - 10, masks.size() > 1 ? fmt::format("head {}: ", m) : "", l.rows(), l.cols(),
                        l.blocks(), step > 1 ? fmt::format(" (a cell: {} × {} blocks)", step, step) : "");
    body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#f4f4f4" stroke="#999"/>)"
                        "\n",
                        x0, kHeader, w, h);
    for (std::int64_t r = 0; r < cell_rows; ++r)
      for (std::int64_t c = 0; c < cell_cols; ++c) {
        const std::int64_t n = count[r * cell_cols + c];
        if (n == 0) continue;
        const double shade = static_cast<double>(n) / static_cast<double>(step * step);
        body += fmt::format(R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="#1f4e9c"{}/>)"
                            "\n",
                            x0 + c * cell, kHeader + r * cell, cell, cell,
                            shade < 1 ? fmt::format(R"( fill-opacity="{:.3f}")", std::max(shade, 0.08)) : "");
      }
    x0 += w + kGap;
    height = std::max(height, h);
  }
  return fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif">)"
      "\n<title>{}</title>\n{}</svg>\n",
      x0, kHeader + height + kGap, title, body);
}

}  // namespace bsjit::tools
