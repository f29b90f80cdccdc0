// libFuzzer target: the cache entry reader (KernelCache::deserialize) on any bytes returns a kernel
// or nullptr with a reason, nothing else.
#include <cstdlib>
#include <string>

#include "cache/kernel_cache.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::string why;
  bsjit::cache::EntryHeader header;
  const auto kernel = bsjit::cache::KernelCache::deserialize(bytes, "", &why, &header);
  if (!kernel && why.empty()) std::abort();  // a refusal always says why
  return 0;
}
