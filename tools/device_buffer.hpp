// A device allocation through the driver API, for the tools and tests.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/driver.hpp"

namespace bsjit::tools {

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : bytes(n) { BSJIT_CU(runtime::driver().cuMemAlloc(&ptr, n ? n : 16)); }
  ~DeviceBuffer() {
    if (ptr) runtime::driver().cuMemFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr); }
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
