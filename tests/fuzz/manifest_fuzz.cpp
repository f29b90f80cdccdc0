// libFuzzer target: Manifest::load on any bytes ends in a manifest or a bsjit::Error, nothing else.
#include "bsjit/deploy.hpp"
#include "bsjit/error.hpp"
#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = bsjit::fuzz::input_file(data, size, ".json");
  try {
    const bsjit::Manifest manifest = bsjit::Manifest::load(path);
    (void)manifest.kernel_count();
  } catch (const bsjit::Error&) {
  }
  return 0;
}
