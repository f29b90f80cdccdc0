// libFuzzer target: Layout::from_npy on any bytes ends in a layout or a bsjit::Error, nothing else
// (no crash, no other exception, no sanitizer report). A layout it returns round-trips.
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
  return 0;
}
