// Where compiled kernels are kept. Every kernel is held in memory for the life of the process and,
// unless disabled, in a directory on disk so that the next process loads it instead of compiling.
#pragma once

#include <cstdint>
#include <filesystem>

namespace bsjit {

// $BSJIT_CACHE_DIR, else $XDG_CACHE_HOME/bsjit, else $HOME/.cache/bsjit; empty when none is set.
std::filesystem::path default_cache_directory();

// Changes the process-wide cache directory; an empty path keeps kernels in memory only.
void set_cache_directory(const std::filesystem::path& directory);
std::filesystem::path cache_directory();

struct CacheStats {
  std::int64_t memory_hits = 0;  // found in this process
  std::int64_t disk_hits = 0;    // loaded from the cache directory
  std::int64_t compiles = 0;     // compiled with NVRTC
  std::int64_t bad_entries = 0;  // disk entries rejected (corrupt, truncated, foreign) and rebuilt
};
CacheStats cache_stats();

}  // namespace bsjit
