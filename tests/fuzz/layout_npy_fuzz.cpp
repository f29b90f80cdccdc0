// libFuzzer target: Layout::from_npy and Layout::load_heads (3-D [heads, rows, cols] files too) on
// any bytes end in layouts or a bsjit::Error, nothing else (no crash, no other exception, no
// sanitizer report).
#include "bsjit/error.hpp"
#include "bsjit/layout.hpp"
#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = bsjit::fuzz::input_file(data, size, ".npy");
  try {
    const bsjit::Layout layout = bsjit::Layout::from_npy(path);
    (void)layout.stats();
    (void)layout.hash();
  } catch (const bsjit::Error&) {
  }
  try {
    for (const auto& head : bsjit::Layout::load_heads(path)) (void)head.stats();
  } catch (const bsjit::Error&) {
  }
  return 0;
}
