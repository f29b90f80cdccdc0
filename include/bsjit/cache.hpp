// Where compiled kernels are kept, and the tools a deployment uses on them.
//
// Kernels are held in memory (every one in use, and the 512 used last of the others) and, unless
// disabled, in a writable directory on disk, so the next process loads them instead of compiling.
// Read-only directories of precompiled kernels (shipped with a service) are searched after the
// writable one.
//
// A cache directory holds executable code: bsjit refuses a directory (or entry) that a user other
// than the current one (or root) owns or can write, as ssh's StrictModes does, because whoever can
// write there can make this process run their GPU code. `allow_insecure` overrides that.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace bsjit {

struct CacheConfig {
  std::filesystem::path directory;                // writable layer; empty: memory only
  std::vector<std::filesystem::path> read_only;   // precompiled layers, searched in order after it
  std::uint64_t max_bytes = 0;                    // bound on the writable layer (0: none); least recently used go first
  bool strict = false;                            // a kernel missing from the cache at run time is an Error
  bool allow_insecure = false;                    // accept directories and entries other users can write
};

// From the environment:
//   BSJIT_CACHE_DIR (else $XDG_CACHE_HOME/bsjit, else $HOME/.cache/bsjit)  writable directory
//   BSJIT_CACHE_PATH       read-only directories, ':'-separated
//   BSJIT_CACHE_MAX_SIZE   bytes, with an optional K, M or G suffix
//   BSJIT_STRICT_CACHE=1   strict mode
//   BSJIT_CACHE_ALLOW_INSECURE=1
CacheConfig default_cache_config();
// "1048576", "500K", "200M", "2G" → bytes; throws Error otherwise.
std::uint64_t parse_byte_size(const std::string& text);
std::filesystem::path default_cache_directory();

// Replaces the process-wide configuration (kernels already in memory stay).
void configure_cache(const CacheConfig& config);
CacheConfig cache_config();
// Shorthands: change only the writable directory (empty: memory only), or only strict mode.
void set_cache_directory(const std::filesystem::path& directory);
std::filesystem::path cache_directory();
void set_strict_cache(bool strict);

struct CacheStats {
  std::int64_t memory_hits = 0;  // found in this process
  std::int64_t disk_hits = 0;    // loaded from a cache directory
  std::int64_t compiles = 0;     // compiled with NVRTC
  // built from the code of another layout of the same shape, compiled or loaded by this process
  // or found in a cache directory (no NVRTC)
  std::int64_t shared_compiles = 0;
  std::int64_t bad_entries = 0;  // disk entries rejected (corrupt, truncated, stale, foreign, insecure) and rebuilt
};
CacheStats cache_stats();

// One file of a cache directory, as `bsjit cache list` shows it.
struct CacheEntryInfo {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::chrono::system_clock::time_point last_used;
  bool valid = false;
  std::string problem;  // why not valid
  std::string key, label, arch, layout_hash, lowered_name;
};
std::vector<CacheEntryInfo> list_cache(const std::filesystem::path& directory);

struct PruneResult {
  std::int64_t removed = 0;
  std::uint64_t bytes_removed = 0, bytes_left = 0;
};
// Removes least recently used entries until the directory holds at most max_bytes, and entries not
// used for max_age (zero: no age limit); also invalid entries and temporary files left by crashes.
PruneResult prune_cache(const std::filesystem::path& directory, std::uint64_t max_bytes,
                        std::chrono::seconds max_age = std::chrono::seconds(0));
// Removes every entry, lock and temporary file bsjit made in directory.
PruneResult clear_cache(const std::filesystem::path& directory);

}  // namespace bsjit
