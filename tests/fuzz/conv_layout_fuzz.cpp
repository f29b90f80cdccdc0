// libFuzzer target: ConvLayout::from_json on any bytes (both forms: "C", "K", "blocks", and
// "block", "mask") ends in a layout or a bsjit::Error, nothing else.
#include "bsjit/conv_layout.hpp"
#include "bsjit/error.hpp"
#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = bsjit::fuzz::input_file(data, size, ".json");
  try {
    const bsjit::ConvLayout layout = bsjit::ConvLayout::from_json(path);
    (void)layout.filter_elements(27);
  } catch (const bsjit::Error&) {
  }
  return 0;
}
