// A device allocation with host copies in and out, for the tools and tests.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit::tools {

struct DeviceBuffer : runtime::DeviceMemory {
  using DeviceMemory::DeviceMemory;
  template <class T>
  void upload(const std::vector<T>& host) {
    if (!host.empty()) BSJIT_CU(runtime::driver().cuMemcpyHtoD(ptr, host.data(), host.size() * sizeof(T)));
  }
  template <class T = std::uint8_t>
  std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    if (bytes) BSJIT_CU(runtime::driver().cuMemcpyDtoH(host.data(), ptr, host.size() * sizeof(T)));
    return host;
  }
};

}  // namespace bsjit::tools
