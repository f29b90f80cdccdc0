// In-memory and on-disk cache of compiled kernels, keyed by a hash of everything that shapes the
// binary.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "bsjit/cache.hpp"
#include "runtime/compiler.hpp"

namespace bsjit::cache {

// Version of the on-disk entry format (see kernel_cache.cpp). Changing the format, or what goes
// into the key, requires bumping this.
constexpr int kFormatVersion = 1;

// 32 hex digits: XXH3-128 of the format version, the generated source (which holds the layout),
// the embedded templates' hash, the target arch, the NVRTC options and the NVRTC version.
std::string make_key(const std::string& source, const std::string& arch);

class KernelCache {
 public:
  using Compiled = std::shared_ptr<const runtime::CompiledKernel>;

  explicit KernelCache(std::filesystem::path directory);

  // The kernel for key: from memory, else from disk, else from compile() (then stored in both).
  // Threads asking for the same key wait for one compile; different keys compile in parallel.
  Compiled get_or_compile(const std::string& key, const std::string& file_stem,
                          const std::function<runtime::CompiledKernel()>& compile);

  void set_directory(std::filesystem::path directory);
  std::filesystem::path directory() const;
  std::filesystem::path entry_path(const std::string& key, const std::string& file_stem) const;
  CacheStats stats() const;

  static KernelCache& global();

  // Entry file format, exposed for tests. Returns nullptr when the bytes are not a valid entry
  // for key (with the reason in *why).
  static std::string serialize(const std::string& key, const runtime::CompiledKernel& kernel);
  static std::shared_ptr<runtime::CompiledKernel> deserialize(const std::string& bytes, const std::string& key,
                                                             std::string* why);

 private:
  struct Slot {
    std::mutex mutex;  // held while this key compiles
    Compiled kernel;
  };
  Compiled load_from_disk(const std::string& key, const std::filesystem::path& path);
  void store_to_disk(const std::string& key, const std::filesystem::path& path, const runtime::CompiledKernel& k);

  mutable std::mutex mutex_;  // guards slots_ and directory_
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
  std::filesystem::path directory_;
  bool disk_usable_ = true;
  std::atomic<std::int64_t> memory_hits_{0}, disk_hits_{0}, compiles_{0}, bad_entries_{0};
};

}  // namespace bsjit::cache
