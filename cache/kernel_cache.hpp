// In-memory and on-disk cache of compiled kernels, keyed by a hash of everything that shapes the
// binary. See include/bsjit/cache.hpp for the user's view and kernel_cache.cpp for the file format.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bsjit/cache.hpp"
#include "runtime/compiler.hpp"

namespace bsjit::cache {

// Version of the on-disk entry format (kernel_cache.cpp) and of what goes into the key. Changing
// either requires bumping it; the golden files in tests/data catch a forgotten bump.
constexpr int kFormatVersion = 5;

// Everything that shapes the binary and what is loaded with it.
struct KeyInputs {
  std::string source;          // generated source; declares the layout's tables
  std::string tables_digest;   // their values (generator::tables_digest)
  std::string templates_hash;  // the embedded templates it includes
  std::string arch;            // exact target, "a" suffix included
  std::vector<std::string> options;
  std::string nvrtc_version;
  int format_version = kFormatVersion;
};
// The inputs for source with its tables compiled for arch by this build of bsjit with this NVRTC.
KeyInputs key_inputs(const std::string& source, const generator::DeviceTables& tables, const std::string& arch);
// 32 hex digits: XXH3-128 of the inputs.
std::string make_key(const KeyInputs& inputs);
// The key of what NVRTC makes of source for arch: make_key without the tables' values.
std::string code_key(const std::string& source, const std::string& arch);

// The header of an entry: what the file says it holds.
struct EntryHeader {
  std::string key, label, arch, layout_hash, lowered_name;
  std::string code_key;  // Request::code_key: entries of one code key hold the same cubin
  std::vector<std::string> options;
  std::uint64_t cubin_size = 0;
  std::string cubin_xxh64;
  std::vector<std::pair<std::string, std::uint64_t>> tables;  // name and number of values of each
  std::string tables_xxh64;
  int shared_bytes = 0;
};

struct Request {
  std::string key;
  std::string label;        // "forward-bf16-b32-last": for file names and messages
  std::string arch;
  std::string layout_hash;  // for `bsjit cache list`
  std::function<runtime::CompiledKernel()> compile;  // NVRTC on the source: the code, without tables
  // The layout's values, stored with the code (generator::GeneratedSource::tables).
  generator::DeviceTables tables;
  // The key of the code alone (code_key): requests of one code key share one compile, in a
  // process or through an entry on disk, as layouts of one shape do. Empty: no sharing.
  std::string code_key;
  // Appended to a strict cache's miss message: what needs this kernel, where the label alone does
  // not say (a matmul op's general kernel: its calls with options).
  std::string miss_hint;
};

// What a get does with a kernel in no cache.
//   compile: build it (NVRTC, or the code of another layout of its shape with its own tables) and
//     store it in the writable directory: precompile, warm-up's tuning, tests.
//   compile_at_run: the same, except that an entry built from code already built stays in memory.
//     An op's calls (run_time_on_miss): a training job whose layout changes, or a service that
//     meets a new mask per request, would otherwise write a file of a cubin's size (60-100 KB at
//     b = 32) for each new layout of a shape, which another process builds again in about the time
//     it takes to read it, and an unbounded directory would grow with every change.
//   fail: an Error (strict mode).
enum class OnMiss { compile, compile_at_run, fail };

// Why directory (or an entry file in it) must not be trusted, or "" when it may.
std::string insecure_reason(const std::filesystem::path& path);

class KernelCache {
 public:
  using Compiled = std::shared_ptr<const runtime::CompiledKernel>;

  explicit KernelCache(CacheConfig config);

  // The kernel for the request: from memory, else from a cache directory, else compiled (and
  // stored in memory and in the writable directory). Threads asking for one key wait for a single
  // compile; different keys compile in parallel; processes sharing a directory take a lock file
  // per key and look again before compiling. With OnMiss::fail (or strict mode) a kernel in no
  // cache is an Error. A miss whose code key this process has compiled or loaded already, or
  // a cache directory holds (for another layout of the shape), takes that code with the
  // request's tables instead of compiling (without a lock where the code is in memory; with
  // OnMiss::compile_at_run, kept in memory only). *compiled_now tells whether this call made a new
  // entry.
  Compiled get(const Request& request, OnMiss on_miss = OnMiss::compile, bool* compiled_now = nullptr);

  // The request's kernel compiled again with NVRTC, in place of `refused`: a kernel of this
  // request that the driver would not load (an entry that verifies, yet whose binary does not load
  // or lacks its function). The new one replaces it in memory, as its code key's code, and in the
  // writable directory, so no later get, here or in another process, returns the refused code.
  // Where another caller has replaced it already, returns that one. With OnMiss::fail (strict
  // mode, which never compiles at run time) an Error that names the entry.
  Compiled rebuild(const Request& request, const Compiled& refused, OnMiss on_miss = OnMiss::compile);

  // Tuning records: small JSON documents stored beside the kernels (<stem>-<key>.tune), searched in
  // the same layers by that name (one lookup a layer: listing the directory instead, every new
  // layout's first launch took 1.1 ms an op more at 360 entries on the 2-core machine, growing with
  // the cache). find_tuning returns "" when there is none.
  std::string find_tuning(const std::string& key, const std::string& stem);
  void store_tuning(const std::string& key, const std::string& stem, const std::string& json);

  // Puts a kernel read elsewhere (warm-up of a cache directory) into memory under key, and its
  // code under code_key (EntryHeader::code_key) when not empty.
  void insert(const std::string& key, Compiled kernel, const std::string& code_key = "");

  void configure(CacheConfig config);
  CacheConfig config() const;
  // What an op does with a kernel in no cache: OnMiss::fail in strict mode, else compile_at_run.
  OnMiss run_time_on_miss() const { return config().strict ? OnMiss::fail : OnMiss::compile_at_run; }
  // Where an entry for request is (or would be) written; empty when there is no usable
  // writable directory.
  std::filesystem::path entry_path(const Request& request);
  CacheStats stats() const;
  // How a precompile tells what reached the disk: the entries written to the directory while a
  // recording is open (record_writes(true) ... (false), nesting; the list is dropped when the last
  // one closes, so a process that never records keeps none), and how many kernels were stored in
  // memory only (no directory, or the write failed), counted always.
  struct DiskWrites {
    std::vector<std::filesystem::path> written;
    std::int64_t not_written = 0;
  };
  DiskWrites disk_writes() const;
  void record_writes(bool on);

  static KernelCache& global();

  // The memory layer keeps every kernel someone else holds (a MatMul, an attention object, a
  // parked loaded kernel, the code of a code key), and of the others the kMemoryEntries used last:
  // once it has twice that many entries, the rest are forgotten (a later get reads them from disk,
  // or builds them from their code key's code in milliseconds). So a service that meets a new mask
  // per request keeps a bounded memory; before, each request's entries (a cubin each) stayed.
  static constexpr std::size_t kMemoryEntries = 512;

  // The entry file format, exposed for tests and tools. deserialize returns nullptr when the bytes
  // are not a valid entry (for expected_key, when not empty), with the reason in *why.
  static std::string serialize(const Request& request, const runtime::CompiledKernel& kernel);
  static std::shared_ptr<runtime::CompiledKernel> deserialize(const std::string& bytes, const std::string& expected_key,
                                                             std::string* why, EntryHeader* header = nullptr);

 private:
  struct Slot {
    std::mutex mutex;  // held while this key is looked up on disk or compiled
    Compiled kernel;
    std::uint64_t used = 0;  // use_clock_ at the last get (under mutex_)
  };
  struct CodeSlot {
    std::mutex mutex;  // held while this code is looked for on disk or compiled
    Compiled kernel;   // an entry holding the code (kept in the memory layer too: no second copy)
  };
  // The slot of key in slots (a new one the first time).
  template <class S>
  std::shared_ptr<S> slot_in(std::unordered_map<std::string, std::shared_ptr<S>>& slots, const std::string& key);
  void trim_memory();  // (kMemoryEntries)
  // A disk hit for request: counted, and its code offered to later misses of its code key.
  Compiled loaded(const Request& request, Compiled kernel);
  // Keeps kernel as the code of code_key unless it has one (nothing for an empty code_key).
  void offer_code(const std::string& code_key, const Compiled& kernel);
  // An entry of request's code key (another layout) in a cache directory, read whole and verified;
  // nullptr when there is none.
  Compiled code_from_layers(const Request& request);
  // The request's code with its tables: from an entry of the same code key (*shared set), else
  // compiled.
  std::shared_ptr<runtime::CompiledKernel> build(const Request& request, bool* shared);
  // NVRTC on the request's source (counted), with the request's tables.
  std::shared_ptr<runtime::CompiledKernel> compile_now(const Request& request);
  // code's binary with the request's tables (counted as a shared compile).
  std::shared_ptr<runtime::CompiledKernel> with_code_of(const runtime::CompiledKernel& code, const Request& request);
  // quiet: a bad entry is neither counted nor logged (a second look after taking the lock).
  Compiled load_from(const std::filesystem::path& path, const std::string& key, bool writable_layer, bool quiet);
  Compiled load_from_layers(const Request& request, bool quiet);
  void store(const Request& request, const runtime::CompiledKernel& kernel);
  // Whether code_key's code is in memory: a miss of it then builds in milliseconds, without NVRTC.
  bool code_in_memory(const std::string& code_key);
  // Writes bytes to path through a unique temporary file, fsync and rename; false on failure
  // (after one warning, writes to the directory stop).
  bool write_atomically(const std::filesystem::path& path, const std::string& bytes);

  mutable std::mutex mutex_;  // guards slots_, config_ and the layer state below
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots_;
  std::uint64_t use_clock_ = 0;
  // The writable directory's entries in bytes as this process counts them: what the last look at
  // the directory found plus what it has written since (other processes' writes are not in it).
  // A store looks at the directory again only when this passes CacheConfig::max_bytes.
  std::optional<std::uint64_t> directory_bytes_;
  std::unordered_map<std::string, std::shared_ptr<CodeSlot>> code_slots_;  // by code key
  std::unordered_map<std::string, std::string> tunings_;  // key → record, once found or stored
  CacheConfig config_;
  void open_directory_locked();
  bool trusted_directory(const std::filesystem::path& dir, const char* role) const;
  bool pending_ = false;   // the writable directory is still to be created and checked (at the first write)
  bool writable_ = false;  // the writable directory exists, is trusted and writable
  std::vector<std::filesystem::path> readable_;  // trusted layers, writable first
  std::atomic<std::int64_t> memory_hits_{0}, disk_hits_{0}, compiles_{0}, shared_compiles_{0}, bad_entries_{0};
  DiskWrites disk_writes_;  // guarded by mutex_
  int recordings_ = 0;      // open record_writes; guarded by mutex_
};

}  // namespace bsjit::cache
