#include "cache/kernel_cache.hpp"

#include <gtest/gtest.h>
#define XXH_INLINE_ALL
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "bsjit/error.hpp"
#include "command.hpp"
#include "runtime/module.hpp"

namespace bsjit::cache {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("bsjit-cache-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
    fs::permissions(path, fs::perms::owner_all);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

CacheConfig config_for(const fs::path& dir) {
  CacheConfig c;
  c.directory = dir;
  return c;
}

runtime::CompiledKernel fake_kernel(const std::string& tag) {
  runtime::CompiledKernel k;
  k.cubin.assign(tag.begin(), tag.end());
  k.cubin.resize(300, 'x');
  k.lowered_name = "_Z6kernel" + tag;
  k.arch = "sm_90";
  k.options = runtime::compile_options("sm_90");
  k.shared_bytes = 50000;
  k.tables = {{"kOffsets", {0, 2, -1}}, {"kEmpty", {}}, {"kLut", {7, 1 << 30, -123456}}};
  return k;
}

// A request whose compile counts into *compiles.
Request request(const std::string& key, std::atomic<int>* compiles, const std::string& tag = "k") {
  Request r;
  r.key = key;
  r.label = "forward-bf16-b32-last";
  r.arch = "sm_90";
  r.layout_hash = "0123";
  r.compile = [compiles, tag] {
    ++*compiles;
    auto k = fake_kernel(tag);
    k.tables.clear();  // the code alone: the cache adds the request's tables
    return k;
  };
  r.tables = fake_kernel(tag).tables;
  return r;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CacheKey, ChangesWithEveryInput) {
  const generator::DeviceTables tables = {{"kLut", {1, 2, 3}}, {"kOffsets", {0, 3}}};
  const KeyInputs base = key_inputs("source", tables, "sm_90");
  EXPECT_EQ(base.format_version, kFormatVersion);
  EXPECT_FALSE(base.templates_hash.empty());
  EXPECT_FALSE(base.nvrtc_version.empty());
  const std::string k = make_key(base);
  EXPECT_EQ(k.size(), 32u);
  EXPECT_EQ(k, make_key(key_inputs("source", tables, "sm_90")));
  // the tables' values, names and boundaries are all part of the key
  auto value = tables, name = tables, boundary = tables;
  value[0].values[2] = 4;
  name[1].name = "kOffset";
  boundary[0].values.push_back(0), boundary[1].values.erase(boundary[1].values.begin());
  for (const auto& other : {value, name, boundary, generator::DeviceTables{}})
    EXPECT_NE(make_key(key_inputs("source", other, "sm_90")), k);
  std::vector<KeyInputs> changed(7, base);
  changed[0].source += " ";
  changed[1].templates_hash[0] ^= 1;
  changed[2].arch = "sm_90a";
  changed[3].options.push_back("-lineinfo");
  changed[4].nvrtc_version = "12.9";
  changed[5].format_version += 1;
  changed[6].options.back() += "x";
  for (std::size_t i = 0; i < changed.size(); ++i) EXPECT_NE(make_key(changed[i]), k) << "input " << i;
  // fields cannot bleed into each other
  KeyInputs a = base, b = base;
  a.arch = "sm_9";
  a.nvrtc_version = "0" + base.nvrtc_version;
  b.arch = "sm_90";
  EXPECT_NE(make_key(a), make_key(b));
}

TEST(CacheFormat, HeaderRoundTrip) {
  std::atomic<int> n{0};
  auto r = request("key1", &n);
  r.code_key = "code1";
  auto k = fake_kernel("a");
  std::string why;
  EntryHeader h;
  auto back = KernelCache::deserialize(KernelCache::serialize(r, k), "key1", &why, &h);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->cubin, k.cubin);
  EXPECT_EQ(back->lowered_name, k.lowered_name);
  EXPECT_EQ(back->arch, k.arch);
  EXPECT_EQ(back->options, k.options);
  EXPECT_EQ(back->shared_bytes, k.shared_bytes);
  ASSERT_EQ(back->tables.size(), k.tables.size());
  for (std::size_t i = 0; i < k.tables.size(); ++i) {
    EXPECT_EQ(back->tables[i].name, k.tables[i].name);
    EXPECT_EQ(back->tables[i].values, k.tables[i].values);
  }
  EXPECT_EQ(h.label, "forward-bf16-b32-last");
  EXPECT_EQ(h.layout_hash, "0123");
  EXPECT_EQ(h.code_key, "code1");
  EXPECT_EQ(h.cubin_size, 300u);
}

TEST(CacheFormat, RejectsDamagedEntries) {
  std::atomic<int> n{0};
  const std::string good = KernelCache::serialize(request("key1", &n), fake_kernel("a"));
  std::string flipped = good, bad_magic = good, bad_version = good, bad_header = good;
  flipped[flipped.size() - 40] ^= 0x40;  // inside the cubin
  std::string flipped_table = good;
  flipped_table[flipped_table.size() - 13] ^= 0x01;  // in kLut's second value (before the 8-byte checksum)
  bad_magic[0] = 'X';
  bad_version[8] = 1;
  bad_header[17] = '#';
  const std::pair<const char*, std::string> cases[] = {{"empty", ""},
                                                       {"truncated header", good.substr(0, 20)},
                                                       {"truncated cubin", good.substr(0, good.size() - 1)},
                                                       {"extra bytes", good + "z"},
                                                       {"flipped byte", flipped},
                                                       {"flipped table byte", flipped_table},
                                                       {"wrong magic", bad_magic},
                                                       {"stale version", bad_version},
                                                       {"malformed header", bad_header}};
  for (const auto& [what, bytes] : cases) {
    std::string why;
    EXPECT_FALSE(KernelCache::deserialize(bytes, "key1", &why)) << what;
    EXPECT_FALSE(why.empty()) << what;
  }
  std::string why;
  EXPECT_FALSE(KernelCache::deserialize(good, "another-key", &why));
  EXPECT_NE(why.find("foreign"), std::string::npos) << why;
  // header numbers that are not integers in range are refused, not converted
  const std::uint32_t header_size = static_cast<std::uint8_t>(good[12]) | static_cast<std::uint8_t>(good[13]) << 8 |
                                    static_cast<std::uint8_t>(good[14]) << 16 |
                                    static_cast<std::uint8_t>(good[15]) << 24;
  const std::string header = good.substr(16, header_size);
  const auto at = header.find("\"shared_bytes\":");
  ASSERT_NE(at, std::string::npos) << header;
  const auto end = header.find_first_of(",}", at);
  for (const char* value : {"1e300", "2.5", "-5", "\"4096\"", "99999999999"}) {
    const std::string changed = header.substr(0, at) + "\"shared_bytes\":" + value + header.substr(end);
    std::string bytes = good.substr(0, 12);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((changed.size() >> (8 * i)) & 0xff));
    bytes += changed + good.substr(16 + header_size, good.size() - 8 - 16 - header_size);
    const std::uint64_t sum = XXH3_64bits(bytes.data(), bytes.size());  // a whole entry but for the value
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
    why.clear();
    EXPECT_FALSE(KernelCache::deserialize(bytes, "key1", &why)) << value;
    EXPECT_NE(why.find("malformed header"), std::string::npos) << value << ": " << why;
  }
}

// Every single-bit flip anywhere in an entry, its JSON header included (a lowered name, a table's
// name, the options, the shared-memory size, a key), is caught by the entry's checksum.
TEST(CacheFormat, EveryBitFlipIsCaught) {
  std::atomic<int> n{0};
  const std::string good = KernelCache::serialize(request("key1", &n), fake_kernel("a"));
  std::string why;
  ASSERT_TRUE(KernelCache::deserialize(good, "key1", &why)) << why;
  int caught = 0, flips = 0;
  for (std::size_t byte = 0; byte < good.size(); ++byte)
    for (int bit = 0; bit < 8; ++bit, ++flips) {
      std::string bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      caught += KernelCache::deserialize(bad, "key1", &why) == nullptr;
    }
  EXPECT_EQ(caught, flips) << "of " << good.size() << " bytes";
}

// Golden file: pins the on-disk format. If this fails after a format change, bump kFormatVersion
// and write the new version's golden file (BSJIT_UPDATE_GOLDEN=1).
TEST(CacheFormat, MatchesGoldenFile) {
  runtime::CompiledKernel k;
  k.cubin = {'\x7f', 'E', 'L', 'F', '\0', '\1', '\2', '\3'};
  k.lowered_name = "_Z10dsd_kernelIN16bsjit_generated6ConfigEEvPKT_";
  k.arch = "sm_90a";
  k.options = {"--gpu-architecture=sm_90a", "-std=c++17"};
  k.shared_bytes = 75776;
  k.tables = {{"kLutOffsets", {0, 2}}, {"kLut", {0, 0, 2, -1}}};
  Request r{"0123456789abcdef0123456789abcdef", "forward-bf16-b32-last", "sm_90a", "ffeeddccbbaa99887766554433221100", {}};
  r.code_key = "00112233445566778899aabbccddeeff";
  const std::string bytes = KernelCache::serialize(r, k);
  const fs::path golden = fs::path(BSJIT_TEST_DATA) / ("cache_entry_v" + std::to_string(kFormatVersion) + ".bin");
  if (std::getenv("BSJIT_UPDATE_GOLDEN")) std::ofstream(golden, std::ios::binary) << bytes;
  ASSERT_TRUE(fs::exists(golden)) << golden << " is missing: a format version without a golden file";
  EXPECT_EQ(bytes, read(golden)) << "the cache entry format changed: bump kFormatVersion and add a golden file";
  // Entries of every older format version are detected as stale, never misread.
  for (int v = 1; v < kFormatVersion; ++v) {
    auto old = fs::path(BSJIT_TEST_DATA) / ("cache_entry_v" + std::to_string(v) + ".bin");
    if (!fs::exists(old)) continue;
    std::string why;
    EXPECT_FALSE(KernelCache::deserialize(read(old), "", &why)) << old;
    EXPECT_NE(why.find("stale"), std::string::npos) << why;
  }
}

TEST(KernelCache, MemoryThenDiskThenCorruptRebuilt) {
  TempDir dir;
  std::atomic<int> compiles{0};
  const auto r = request("key-a", &compiles);
  {
    KernelCache cache(config_for(dir.path));
    bool now = false;
    auto a = cache.get(r, OnMiss::compile, &now);
    EXPECT_TRUE(now);
    auto b = cache.get(r, OnMiss::compile, &now);
    EXPECT_FALSE(now);
    EXPECT_EQ(a, b);
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(cache.stats().memory_hits, 1);
    EXPECT_TRUE(fs::exists(cache.entry_path(r)));
    EXPECT_EQ(cache.entry_path(r).filename(), "forward-bf16-b32-last-sm_90-key-a.bsjit");
    EXPECT_EQ(fs::status(cache.entry_path(r)).permissions() & fs::perms::group_write, fs::perms::none);
  }
  const fs::path path = KernelCache(config_for(dir.path)).entry_path(r);
  const std::string damaged[] = {"", "BSJITKC", read(path).substr(0, 100), read(path) + "x"};
  for (const auto& bytes : damaged) {
    KernelCache fresh(config_for(dir.path));  // a new process, in effect
    auto k = fresh.get(r);
    EXPECT_EQ(k->lowered_name, "_Z6kernelk");
    if (&bytes != &damaged[0]) {
      EXPECT_EQ(fresh.stats().bad_entries, 1);
      EXPECT_EQ(fresh.stats().compiles, 1);
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  KernelCache fresh(config_for(dir.path));
  fresh.get(r);
  std::string why;
  EXPECT_TRUE(KernelCache::deserialize(read(path), "key-a", &why)) << "entry was rewritten whole: " << why;
  for (auto& e : fs::directory_iterator(dir.path))
    EXPECT_TRUE(e.path().extension() == ".bsjit" || e.path().extension() == ".lock") << e.path();
}

// The memory layer forgets the least recently used of the kernels nobody else holds, beyond
// kMemoryEntries of them: a held kernel stays (the same object), the last used stay, the oldest
// is built again.
TEST(KernelCache, MemoryKeepsHeldKernelsAndTheLastUsedOthers) {
  std::atomic<int> compiles{0};
  KernelCache cache(CacheConfig{});  // memory only
  const auto held = cache.get(request("held", &compiles));
  const int n = 2 * static_cast<int>(KernelCache::kMemoryEntries) + 1;
  for (int i = 0; i < n; ++i) cache.get(request("key" + std::to_string(i), &compiles));
  ASSERT_EQ(compiles, n + 1);
  EXPECT_EQ(cache.get(request("held", &compiles)), held);
  for (int i = n - static_cast<int>(KernelCache::kMemoryEntries) + 1; i < n; ++i)
    cache.get(request("key" + std::to_string(i), &compiles));
  EXPECT_EQ(compiles, n + 1) << "the last used stay in memory";
  const auto before = cache.stats().memory_hits;
  cache.get(request("key0", &compiles));
  EXPECT_EQ(compiles, n + 2) << "the least recently used was forgotten";
  EXPECT_EQ(cache.stats().memory_hits, before);
}

TEST(KernelCache, StrictModeTurnsAMissIntoAnError) {
  TempDir dir;
  std::atomic<int> compiles{0};
  KernelCache cache(config_for(dir.path));
  try {
    cache.get(request("missing", &compiles), OnMiss::fail);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strict cache"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.path.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(compiles, 0);
  cache.get(request("missing", &compiles));  // compiled and stored
  KernelCache fresh(config_for(dir.path));
  EXPECT_TRUE(fresh.get(request("missing", &compiles), OnMiss::fail));
  EXPECT_EQ(compiles, 1);
}

TEST(KernelCache, ReadOnlyLayersAreSearchedAfterTheWritableOne) {
  TempDir shipped, local;
  std::atomic<int> compiles{0};
  KernelCache(config_for(shipped.path)).get(request("shipped-key", &compiles, "s"));
  ASSERT_EQ(compiles, 1);
  CacheConfig c = config_for(local.path);
  c.read_only = {shipped.path};
  KernelCache layered(c);
  EXPECT_EQ(layered.get(request("shipped-key", &compiles))->lowered_name, "_Z6kernels");
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(layered.stats().disk_hits, 1);
  layered.get(request("new-key", &compiles));  // compiled into the writable layer only
  EXPECT_EQ(compiles, 2);
  int in_local = 0, in_shipped = 0;
  for (auto& e : fs::directory_iterator(local.path)) in_local += e.path().extension() == ".bsjit";
  for (auto& e : fs::directory_iterator(shipped.path)) in_shipped += e.path().extension() == ".bsjit";
  EXPECT_EQ(in_local, 1);
  EXPECT_EQ(in_shipped, 1);
}

TEST(KernelCache, RefusesDirectoriesOthersCanWrite) {
  TempDir dir;
  std::atomic<int> compiles{0};
  KernelCache(config_for(dir.path)).get(request("key", &compiles));
  fs::permissions(dir.path, fs::perms::group_write | fs::perms::others_write, fs::perm_options::add);
  EXPECT_NE(insecure_reason(dir.path).find("writable"), std::string::npos);
  KernelCache refused(config_for(dir.path));
  EXPECT_TRUE(refused.entry_path(request("key", &compiles)).empty());
  refused.get(request("key", &compiles));
  EXPECT_EQ(compiles, 2) << "an entry in an insecure directory must not be loaded";
  CacheConfig c = config_for(dir.path);
  c.allow_insecure = true;
  KernelCache overridden(c);
  overridden.get(request("key", &compiles));
  EXPECT_EQ(compiles, 2) << "allow_insecure accepts it";
  // an entry file others can write is refused even in a good directory
  fs::permissions(dir.path, fs::perms::group_write | fs::perms::others_write, fs::perm_options::remove);
  auto path = KernelCache(config_for(dir.path)).entry_path(request("key", &compiles));
  fs::permissions(path, fs::perms::others_write, fs::perm_options::add);
  KernelCache strict_files(config_for(dir.path));
  strict_files.get(request("key", &compiles));
  EXPECT_EQ(compiles, 3);
  EXPECT_EQ(strict_files.stats().bad_entries, 1);
}

// A write that fails (here: a directory stands where the entry would go, which stops root too)
// is logged once, and kernels are then kept in memory.
// A write that fails for one entry (a directory sitting at its name) keeps that kernel in memory
// and the directory in use for the others; no temporary file is left.
TEST(KernelCache, FailedWriteKeepsWorkingInMemory) {
  TempDir dir;
  std::atomic<int> compiles{0};
  KernelCache cache(config_for(dir.path));
  fs::create_directories(cache.entry_path(request("key", &compiles)));
  EXPECT_TRUE(cache.get(request("key", &compiles)));
  EXPECT_TRUE(cache.get(request("key", &compiles)));
  EXPECT_EQ(compiles, 1);
  const fs::path other = cache.entry_path(request("other", &compiles));
  ASSERT_FALSE(other.empty()) << "one entry's failure leaves the directory in use";
  EXPECT_TRUE(cache.get(request("other", &compiles)));
  EXPECT_TRUE(fs::is_regular_file(other)) << "the next entry reaches the disk";
  for (auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
}

// The lock of a key is never opened through a link planted at its name: no file appears at the
// link's target, and the kernel still compiles and is stored.
TEST(KernelCache, ALockLinkIsNotFollowed) {
  TempDir dir, elsewhere;
  std::atomic<int> compiles{0};
  KernelCache cache(config_for(dir.path));
  fs::path lock = cache.entry_path(request("key", &compiles));
  lock.replace_extension(".lock");
  const fs::path target = elsewhere.path / "planted";
  fs::create_symlink(target, lock);
  EXPECT_TRUE(cache.get(request("key", &compiles)));
  EXPECT_EQ(compiles, 1);
  EXPECT_FALSE(fs::exists(target)) << "a file was created through the planted link";
}

TEST(KernelCache, UnwritableDirectoryKeepsWorkingInMemory) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop root from writing";
  TempDir dir;
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  KernelCache cache(config_for(dir.path));
  std::atomic<int> compiles{0};
  EXPECT_TRUE(cache.get(request("key", &compiles)));
  EXPECT_TRUE(cache.get(request("key", &compiles)));
  EXPECT_EQ(compiles, 1);
}

TEST(KernelCache, DirectoryThatCannotExistMeansMemoryOnly) {
  TempDir dir;
  std::ofstream(dir.path / "file") << "x";
  KernelCache cache(config_for(dir.path / "file" / "sub"));  // a path through a regular file
  std::atomic<int> compiles{0};
  EXPECT_TRUE(cache.entry_path(request("key", &compiles)).empty());
  cache.get(request("key", &compiles));
  EXPECT_EQ(compiles, 1);
}

TEST(KernelCache, ConcurrentRequestsForOneKeyCompileOnce) {
  TempDir dir;
  KernelCache cache(config_for(dir.path));
  std::atomic<int> compiles{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        auto r = request("key-" + std::to_string(i), &compiles);
        auto inner = r.compile;
        r.compile = [inner] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return inner();
        };
        cache.get(r);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 4);
  EXPECT_EQ(cache.stats().memory_hits, 8 * 4 - 4);
}

TEST(CacheKey, CodeKeyIgnoresTheTablesOnly) {
  const std::string k = code_key("source", "sm_90");
  EXPECT_EQ(k.size(), 32u);
  EXPECT_EQ(k, code_key("source", "sm_90"));
  EXPECT_NE(k, code_key("source ", "sm_90"));
  EXPECT_NE(k, code_key("source", "sm_90a"));
  for (const auto& tables : {generator::DeviceTables{}, generator::DeviceTables{{"kLut", {}}}})
    EXPECT_NE(k, make_key(key_inputs("source", tables, "sm_90"))) << "a code key is never an entry's key";
}

// Requests for layouts of one shape: one code key, each its own key and tables.
Request layout_request(int layout, std::atomic<int>* compiles) {
  auto r = request("key-layout-" + std::to_string(layout), compiles, "shape");
  r.code_key = "code-of-the-shape";
  r.layout_hash = std::to_string(layout);
  r.tables = {{"kLut", {layout, layout + 1}}, {"kOffsets", {0, 2}}};
  return r;
}

TEST(KernelCache, LayoutsOfOneShapeShareOneCompile) {
  TempDir dir;
  std::atomic<int> compiles{0};
  {
    KernelCache cache(config_for(dir.path));
    bool now = false;
    auto a = cache.get(layout_request(1, &compiles));
    auto b = cache.get(layout_request(2, &compiles), OnMiss::compile, &now);
    EXPECT_TRUE(now) << "a new entry, though not compiled";
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(cache.stats().compiles, 1);
    EXPECT_EQ(cache.stats().shared_compiles, 1);
    EXPECT_NE(a, b);
    EXPECT_EQ(a->cubin, b->cubin);
    EXPECT_EQ(a->lowered_name, b->lowered_name);
    EXPECT_EQ(a->tables[0].values, (std::vector<int>{1, 2}));
    EXPECT_EQ(b->tables[0].values, (std::vector<int>{2, 3}));
    // the compile waited on a lock file, for another process compiling the key; the build from
    // code in memory takes none
    auto lock_of = [&](int layout) {
      return cache.entry_path(layout_request(layout, &compiles)).replace_extension(".lock");
    };
    EXPECT_TRUE(fs::exists(lock_of(1)));
    EXPECT_FALSE(fs::exists(lock_of(2)));
    EXPECT_TRUE(fs::exists(cache.entry_path(layout_request(2, &compiles))));
    // another code key compiles
    auto other = layout_request(3, &compiles);
    other.code_key = "code-of-another-shape";
    cache.get(other);
    EXPECT_EQ(compiles, 2);
  }
  // A new process: the second layout's entry is on disk with its own tables; a layout not on disk
  // takes the code of the entry read from disk.
  KernelCache fresh(config_for(dir.path));
  EXPECT_EQ(fresh.get(layout_request(2, &compiles))->tables[0].values, (std::vector<int>{2, 3}));
  auto c = fresh.get(layout_request(4, &compiles));
  EXPECT_EQ(c->tables[0].values, (std::vector<int>{4, 5}));
  EXPECT_EQ(compiles, 2);
  EXPECT_EQ(fresh.stats().disk_hits, 1);
  EXPECT_EQ(fresh.stats().shared_compiles, 1);
  EXPECT_EQ(fresh.stats().compiles, 0);
  std::string why;
  auto stored = KernelCache::deserialize(read(fresh.entry_path(layout_request(4, &compiles))), "key-layout-4", &why);
  ASSERT_TRUE(stored) << why;
  EXPECT_EQ(stored->tables[0].values, (std::vector<int>{4, 5}));
  // A new process whose first request is a layout on no disk: the code of an entry of its code
  // key in the directory serves it.
  KernelCache third(config_for(dir.path));
  EXPECT_EQ(third.get(layout_request(5, &compiles))->tables[0].values, (std::vector<int>{5, 6}));
  EXPECT_EQ(compiles, 2);
  EXPECT_EQ(third.stats().shared_compiles, 1);
  EXPECT_EQ(third.stats().disk_hits, 0);
}

// An op's calls (OnMiss::compile_at_run) keep an entry built from code already built in memory:
// a new layout of a known shape writes no file, and a new process builds it from the code on disk
// again without NVRTC. What NVRTC compiles is stored, as is everything a precompile builds.
TEST(KernelCache, RunTimeBuildsFromSharedCodeStayInMemory) {
  TempDir dir;
  std::atomic<int> compiles{0};
  auto entry_of = [&](KernelCache& cache, int layout) { return cache.entry_path(layout_request(layout, &compiles)); };
  {
    KernelCache cache(config_for(dir.path));
    cache.get(layout_request(1, &compiles), OnMiss::compile_at_run);
    EXPECT_TRUE(fs::exists(entry_of(cache, 1))) << "compiled with NVRTC: stored";
    bool now = false;
    auto b = cache.get(layout_request(2, &compiles), OnMiss::compile_at_run, &now);
    EXPECT_TRUE(now);
    EXPECT_EQ(b->tables[0].values, (std::vector<int>{2, 3}));
    EXPECT_FALSE(fs::exists(entry_of(cache, 2))) << "built from the code in memory at run time: not stored";
    cache.get(layout_request(3, &compiles), OnMiss::compile);
    EXPECT_TRUE(fs::exists(entry_of(cache, 3))) << "built from shared code by a precompile: stored";
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(cache.stats().shared_compiles, 2);
    EXPECT_EQ(cache.get(layout_request(2, &compiles), OnMiss::compile_at_run), b) << "kept in memory";
  }
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.path().extension() == ".bsjit";
  EXPECT_EQ(files, 2u);
  KernelCache fresh(config_for(dir.path));
  EXPECT_EQ(fresh.get(layout_request(2, &compiles), OnMiss::compile_at_run)->tables[0].values,
            (std::vector<int>{2, 3}));
  EXPECT_EQ(compiles, 1) << "the code came from an entry of the shape on disk";
  EXPECT_EQ(fresh.stats().shared_compiles, 1);
  EXPECT_FALSE(fs::exists(entry_of(fresh, 2)));
  EXPECT_EQ(KernelCache(config_for(dir.path)).run_time_on_miss(), OnMiss::compile_at_run);
}

// Warm-up of a directory inserts what it read, with the code key its header names.
TEST(KernelCache, InsertedEntriesOfferTheirCode) {
  KernelCache cache(config_for({}));
  std::atomic<int> compiles{0};
  auto code = std::make_shared<runtime::CompiledKernel>(fake_kernel("warm"));
  cache.insert("key-warm", code, "code-of-the-shape");
  cache.insert("key-no-code", std::make_shared<runtime::CompiledKernel>(fake_kernel("other")));
  auto k = cache.get(layout_request(1, &compiles));
  EXPECT_EQ(compiles, 0);
  EXPECT_EQ(k->cubin, code->cubin);
  EXPECT_EQ(k->tables[0].values, (std::vector<int>{1, 2}));
  EXPECT_EQ(cache.stats().shared_compiles, 1);
}

TEST(KernelCache, ADamagedEntryOfTheCodeKeyIsNotUsed) {
  TempDir dir;
  std::atomic<int> compiles{0};
  const auto first = layout_request(1, &compiles);
  KernelCache(config_for(dir.path)).get(first);
  const fs::path path = KernelCache(config_for(dir.path)).entry_path(first);
  std::string bytes = read(path);
  bytes[bytes.size() - 300] ^= 1;  // in the cubin
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  KernelCache fresh(config_for(dir.path));
  EXPECT_EQ(fresh.get(layout_request(2, &compiles))->cubin, fake_kernel("shape").cubin);
  EXPECT_EQ(compiles, 2) << "compiled again, not taken from the damaged entry";
  EXPECT_EQ(fresh.stats().shared_compiles, 0);
  // an entry of another code key under the same label is not taken either
  auto other = layout_request(3, &compiles);
  other.code_key = "code-of-another-shape";
  fresh.get(other);
  EXPECT_EQ(compiles, 3);
}

// An entry that verifies but holds code the driver refuses (here: a function name the code lacks,
// written with a valid checksum), as a bsjit of another build or a hand-made file could leave.
void plant_refused_entry(const Request& r, const fs::path& path) {
  auto refused = fake_kernel("bad");
  refused.tables = r.tables;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << KernelCache::serialize(r, refused);
}

TEST(KernelCache, ARefusedKernelIsRebuiltInMemoryAndOnDisk) {
  TempDir dir;
  std::atomic<int> compiles{0};
  const auto r = request("key-refused", &compiles);
  const fs::path path = KernelCache(config_for(dir.path)).entry_path(r);
  plant_refused_entry(r, path);
  KernelCache cache(config_for(dir.path));
  const auto refused = cache.get(r);
  ASSERT_EQ(refused->lowered_name, "_Z6kernelbad") << "the planted entry verifies";
  EXPECT_EQ(compiles, 0);
  const auto rebuilt = cache.rebuild(r, refused);
  EXPECT_EQ(rebuilt->lowered_name, "_Z6kernelk");
  EXPECT_EQ(rebuilt->tables, r.tables);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(cache.stats().bad_entries, 1);
  EXPECT_EQ(cache.get(r), rebuilt) << "memory holds the new kernel";
  EXPECT_EQ(cache.rebuild(r, refused), rebuilt) << "a second caller with the refused kernel gets the new one";
  EXPECT_EQ(compiles, 1);
  std::string why;
  auto stored = KernelCache::deserialize(read(path), "key-refused", &why);
  ASSERT_TRUE(stored) << why;
  EXPECT_EQ(stored->lowered_name, "_Z6kernelk") << "the entry on disk is replaced";
  KernelCache fresh(config_for(dir.path));
  EXPECT_EQ(fresh.get(r)->lowered_name, "_Z6kernelk");
  EXPECT_EQ(compiles, 1);
  // strict mode compiles nothing: it names the entry
  plant_refused_entry(r, path);
  KernelCache strict(config_for(dir.path));
  const auto strict_refused = strict.get(r, OnMiss::fail);
  try {
    strict.rebuild(r, strict_refused, OnMiss::fail);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("precompile"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(compiles, 1);
}

// Layouts of one shape share code: code the driver refuses is compiled again once, and serves the
// other layouts from then on, the one whose entry held the refused code too.
TEST(KernelCache, ARefusedSharedCodeIsCompiledOnceForEveryLayout) {
  TempDir dir;
  std::atomic<int> compiles{0};
  const auto first = layout_request(1, &compiles);
  const fs::path path = KernelCache(config_for(dir.path)).entry_path(first);
  plant_refused_entry(first, path);
  KernelCache cache(config_for(dir.path));
  const auto second = layout_request(2, &compiles);
  const auto refused = cache.get(second);
  ASSERT_EQ(refused->lowered_name, "_Z6kernelbad") << "the code of the planted entry, shared";
  EXPECT_EQ(compiles, 0);
  EXPECT_EQ(cache.rebuild(second, refused)->lowered_name, "_Z6kernelshape");
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(cache.get(layout_request(3, &compiles))->lowered_name, "_Z6kernelshape");
  const auto first_refused = cache.get(first);
  EXPECT_EQ(first_refused->lowered_name, "_Z6kernelbad") << "its own entry, read from disk";
  const auto first_rebuilt = cache.rebuild(first, first_refused);
  EXPECT_EQ(first_rebuilt->lowered_name, "_Z6kernelshape");
  EXPECT_EQ(first_rebuilt->tables, first.tables);
  EXPECT_EQ(compiles, 1) << "the code compiled for the second layout serves the first";
}

// load_or_rebuild with a stand-in for the driver's loader: a refused kernel is rebuilt and loaded;
// a refusal of the rebuilt code, and failures other than a refusal, are thrown as they are.
TEST(KernelCache, LoadOrRebuildCompilesARefusedKernelAgainOnce) {
  TempDir dir;
  std::atomic<int> compiles{0};
  const auto r = request("key-load", &compiles);
  const fs::path path = KernelCache(config_for(dir.path)).entry_path(r);
  plant_refused_entry(r, path);
  KernelCache cache(config_for(dir.path));
  int loads = 0;
  const runtime::Loader driver_refuses_bad = [&](const KernelCache::Compiled& k) {
    ++loads;
    if (k->lowered_name == "_Z6kernelbad") throw runtime::LoadError("bsjit: cannot load kernel: CUDA_ERROR_NOT_FOUND");
    return std::make_shared<const runtime::LoadedKernel>();
  };
  auto kernel = cache.get(r);
  auto loaded = runtime::load_or_rebuild(&kernel, r, runtime::Context{}, OnMiss::compile, driver_refuses_bad, cache);
  EXPECT_TRUE(loaded);
  EXPECT_EQ(loads, 2);
  EXPECT_EQ(kernel->lowered_name, "_Z6kernelk");
  EXPECT_EQ(compiles, 1);
  // a kernel that loads is not compiled again
  EXPECT_TRUE(runtime::load_or_rebuild(&kernel, r, runtime::Context{}, OnMiss::compile, driver_refuses_bad, cache));
  EXPECT_EQ(compiles, 1);
  // the driver refuses the fresh code too: thrown, saying so
  const runtime::Loader driver_refuses_all = [](const KernelCache::Compiled&) -> runtime::SharedKernels::Handle {
    throw runtime::LoadError("bsjit: cannot load kernel: CUDA_ERROR_INVALID_IMAGE");
  };
  try {
    runtime::load_or_rebuild(&kernel, r, runtime::Context{}, OnMiss::compile, driver_refuses_all, cache);
    FAIL() << "expected a LoadError";
  } catch (const runtime::LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("compiled again"), std::string::npos) << e.what();
  }
  EXPECT_EQ(compiles, 2);
  // any other failure (out of memory, a context gone) is not the code's: no compile
  const runtime::Loader out_of_memory = [](const KernelCache::Compiled&) -> runtime::SharedKernels::Handle {
    throw Error("bsjit: cannot load kernel: CUDA_ERROR_OUT_OF_MEMORY");
  };
  EXPECT_THROW(runtime::load_or_rebuild(&kernel, r, runtime::Context{}, OnMiss::compile, out_of_memory, cache), Error);
  EXPECT_EQ(compiles, 2);
}

TEST(KernelCache, ConcurrentLayoutsOfOneShapeCompileOnce) {
  KernelCache cache(config_for({}));
  std::atomic<int> compiles{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto r = layout_request(t, &compiles);
      auto inner = r.compile;
      r.compile = [inner] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return inner();
      };
      EXPECT_EQ(cache.get(r)->tables[0].values, (std::vector<int>{t, t + 1}));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  EXPECT_EQ(cache.stats().shared_compiles, 7);
}

TEST(KernelCache, TuningRecordsPersistAcrossProcessesAndLayers) {
  TempDir shipped, local;
  const std::string key = "0123456789abcdef0123456789abcdef";
  KernelCache(config_for(shipped.path)).store_tuning(key, "forward-bf16-b32-last-sm_90-any-n", R"({"key": ")" + key + R"(", "x": 1})");
  EXPECT_TRUE(fs::exists(shipped.path / "forward-bf16-b32-last-sm_90-any-n-0123456789abcdef.tune"));
  CacheConfig c = config_for(local.path);
  c.read_only = {shipped.path};
  KernelCache layered(c);  // a later process with the shipped directory as a read-only layer
  const std::string stem = "forward-bf16-b32-last-sm_90-any-n";
  EXPECT_NE(layered.find_tuning(key, stem).find("\"x\": 1"), std::string::npos);
  EXPECT_EQ(layered.find_tuning("ffffffffffffffff0123456789abcdef", stem), "");
  // found by its name: the same key under another stem is another record
  EXPECT_EQ(KernelCache(c).find_tuning(key, "forward-bf16-b64-last-sm_90-any-n"), "");
  // a record whose key does not match its name is ignored
  std::ofstream(local.path / "x-sm_90-aaaaaaaaaaaaaaaa.tune") << R"({"key": "something else"})";
  EXPECT_EQ(KernelCache(config_for(local.path)).find_tuning("aaaaaaaaaaaaaaaa0000000000000000", "x-sm_90"), "");
  EXPECT_GE(clear_cache(shipped.path).removed, 1);
  EXPECT_FALSE(fs::exists(shipped.path / "forward-bf16-b32-last-sm_90-any-n-0123456789abcdef.tune"));
}

// `cache verify` (list_cache) applies the loader's rules: an entry others can write is reported, as
// is a directory sitting at an entry's name, though their bytes would deserialize.
TEST(CacheTools, VerifyReportsWhatTheLoaderRefuses) {
  TempDir dir;
  std::atomic<int> compiles{0};
  KernelCache cache(config_for(dir.path));
  auto r = request("key", &compiles);
  cache.get(r);
  const fs::path entry = cache.entry_path(r);
  fs::permissions(entry, fs::perms::others_write | fs::perms::group_write, fs::perm_options::add);
  fs::create_directories(dir.path / "forward-bf16-b32-last-sm_90-0123456789abcdef.bsjit");
  std::map<std::string, std::string> problems;
  for (const auto& e : list_cache(dir.path)) {
    EXPECT_FALSE(e.valid) << e.path;
    problems[e.path.filename().string()] = e.problem;
  }
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[entry.filename().string()].find("writable by all users"), std::string::npos)
      << problems[entry.filename().string()];
  EXPECT_NE(problems["forward-bf16-b32-last-sm_90-0123456789abcdef.bsjit"].find("not a regular file"),
            std::string::npos);
  EXPECT_FALSE(KernelCache(config_for(dir.path)).get(request("key", &compiles)) == nullptr);
  EXPECT_EQ(compiles, 2) << "the loader refused the entry too, and rebuilt it";
}

TEST(CacheTools, ListPruneClear) {
  TempDir dir;
  std::atomic<int> compiles{0};
  KernelCache cache(config_for(dir.path));
  std::vector<fs::path> paths;
  for (int i = 0; i < 5; ++i) {
    auto r = request("key" + std::to_string(i), &compiles);
    cache.get(r);
    paths.push_back(cache.entry_path(r));
    // last-used stamps one minute apart, key0 the oldest
    fs::last_write_time(paths.back(), fs::file_time_type::clock::now() - std::chrono::minutes(10 - i));
  }
  std::ofstream(dir.path / "junk-sm_90-0000000000000000.bsjit") << "junk";
  auto list = list_cache(dir.path);
  ASSERT_EQ(list.size(), 6u);
  int valid = 0;
  for (const auto& e : list) {
    valid += e.valid;
    if (e.valid) {
      EXPECT_EQ(e.label, "forward-bf16-b32-last");
      EXPECT_EQ(e.layout_hash, "0123");
    } else {
      EXPECT_FALSE(e.problem.empty());
    }
  }
  EXPECT_EQ(valid, 5);
  const std::uint64_t entry = fs::file_size(paths[0]);
  auto r = prune_cache(dir.path, 3 * entry);  // keeps the 3 most recently used, drops junk
  EXPECT_EQ(r.removed, 3);
  EXPECT_EQ(r.bytes_left, 3 * entry);
  EXPECT_FALSE(fs::exists(paths[0]));
  EXPECT_FALSE(fs::exists(paths[1]));
  EXPECT_TRUE(fs::exists(paths[4]));
  // a disk hit refreshes the last-used stamp: key2 becomes the newest
  KernelCache(config_for(dir.path)).get(request("key2", &compiles));
  prune_cache(dir.path, entry);
  EXPECT_TRUE(fs::exists(paths[2]));
  EXPECT_FALSE(fs::exists(paths[4]));
  // by age
  fs::last_write_time(paths[2], fs::file_time_type::clock::now() - std::chrono::hours(48));
  EXPECT_EQ(prune_cache(dir.path, 0, std::chrono::hours(24)).removed, 1);
  cache.get(request("key9", &compiles));
  EXPECT_GE(clear_cache(dir.path).removed, 1);
  for (auto& e : fs::directory_iterator(dir.path)) ADD_FAILURE() << "left after clear: " << e.path();
}

TEST(CacheTools, MaxBytesBoundsTheWritableDirectory) {
  TempDir dir;
  CacheConfig c = config_for(dir.path);
  std::atomic<int> compiles{0};
  KernelCache probe(c);
  probe.get(request("probe", &compiles));
  const auto entry = fs::file_size(probe.entry_path(request("probe", &compiles)));
  clear_cache(dir.path);
  c.max_bytes = 2 * entry + entry / 2;
  KernelCache cache(c);
  for (int i = 0; i < 6; ++i) cache.get(request("k" + std::to_string(i), &compiles));
  std::uint64_t total = 0;
  for (const auto& e : list_cache(dir.path)) total += e.bytes;
  EXPECT_LE(total, c.max_bytes);
  EXPECT_GT(total, 0u);
  // the last stored stays; a removed entry's lock file goes with it
  EXPECT_TRUE(fs::exists(cache.entry_path(request("k5", &compiles))));
  for (const auto& e : fs::directory_iterator(dir.path))
    if (e.path().extension() == ".lock") {
      fs::path entry = e.path();
      EXPECT_TRUE(fs::exists(entry.replace_extension(".bsjit"))) << e.path() << " outlived its entry";
    }
}

// --- stress: many processes on one directory ---------------------------------------------------

int run_worker(const std::string& args, std::string* out) {
  const auto r = bsjit::testing::run_command(std::string(BSJIT_CACHE_WORKER) + " " + args);
  *out += r.output;
  return r.status;
}

TEST(CacheStress, EightProcessesFourThreadsOverlappingKeys) {
  TempDir dir;
  std::vector<std::thread> procs;
  std::vector<std::string> outs(8);
  std::vector<int> codes(8);
  for (int p = 0; p < 8; ++p)
    procs.emplace_back([&, p] { codes[p] = run_worker("precompile " + dir.path.string() + " " + std::to_string(p), &outs[p]); });
  for (auto& t : procs) t.join();
  int built = 0, compiled = 0;
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(codes[p], 0) << outs[p];
    int n = -1, c = -1;
    EXPECT_EQ(std::sscanf(outs[p].c_str(), "built %d compiled %d", &n, &c), 2) << outs[p];
    EXPECT_LE(n, 12) << "a kernel built twice in one process";
    built += n, compiled += c;
  }
  // 3 layouts × (forward: 2 variants, backward-weight: 2). A key's lock file makes its NVRTC run
  // happen once across all processes (8 processes without it); an entry built from code in
  // memory, in milliseconds, takes no lock, so two processes may both build it.
  EXPECT_GE(built, 12);
  EXPECT_LE(compiled, 12) << "the lock file makes every kernel compile once across all processes";
  auto list = list_cache(dir.path);
  EXPECT_EQ(list.size(), 12u);
  for (const auto& e : list) EXPECT_TRUE(e.valid) << e.path << ": " << e.problem;
}

TEST(CacheStress, SigkillDuringWritesLeavesNoBadEntry) {
  TempDir dir;
  std::mt19937 rng(5);
  for (int round = 0; round < 12; ++round) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl(BSJIT_CACHE_WORKER, BSJIT_CACHE_WORKER, "churn", dir.path.c_str(), std::to_string(round).c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 150));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "worker exited by itself with " << status;
  }
  int entries = 0;
  for (const auto& e : list_cache(dir.path)) {
    ++entries;
    EXPECT_TRUE(e.valid) << e.path << ": " << e.problem;
    EXPECT_EQ(e.lowered_name, "churn_" + e.key) << "an entry holds another key's kernel";
  }
  EXPECT_GT(entries, 0);
  // and every one loads through the cache as the kernel of its own key
  KernelCache fresh(config_for(dir.path));
  for (const auto& e : list_cache(dir.path)) {
    Request r{e.key, "churn", "sm_90", "layout", [] { return runtime::CompiledKernel{}; }};
    EXPECT_EQ(fresh.get(r, OnMiss::fail)->lowered_name, "churn_" + e.key);
  }
}

}  // namespace
}  // namespace bsjit::cache
