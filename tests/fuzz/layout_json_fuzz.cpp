// libFuzzer target: Layout::from_json on any bytes (both forms: "mask", and "rows", "cols",
// "blocks") ends in a layout or a bsjit::Error, nothing else.
#include "bsjit/error.hpp"
#include "bsjit/layout.hpp"
#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = bsjit::fuzz::input_file(data, size, ".json");
  try {
    const bsjit::Layout layout = bsjit::Layout::from_json(path);
    (void)layout.stats();
    (void)layout.transposed();
  } catch (const bsjit::Error&) {
  }
  return 0;
}
