// The fuzz targets' shared part: readers that take a path get the input through a file of this
// process's own (the extension picks the reader), rewritten for every input.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace bsjit::fuzz {

inline std::filesystem::path input_file(const std::uint8_t* data, std::size_t size, const std::string& extension) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("bsjit-fuzz-" + std::to_string(::getpid()) + extension);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                               static_cast<std::streamsize>(size));
  return path;
}

}  // namespace bsjit::fuzz
