#include "cache/kernel_cache.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "bsjit/error.hpp"

namespace bsjit::cache {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("bsjit-cache-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

runtime::CompiledKernel fake_kernel(const std::string& tag) {
  runtime::CompiledKernel k;
  k.cubin.assign(tag.begin(), tag.end());
  k.cubin.resize(300, 'x');
  k.lowered_name = "_Z6kernel" + tag;
  k.arch = "sm_90";
  k.options = runtime::compile_options("sm_90");
  return k;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CacheKey, ChangesWithEveryInput) {
  std::string k = make_key("source", "sm_90");
  EXPECT_EQ(k.size(), 32u);
  EXPECT_EQ(k, make_key("source", "sm_90"));
  EXPECT_NE(k, make_key("source ", "sm_90"));
  EXPECT_NE(k, make_key("source", "sm_90a"));
  EXPECT_NE(k, make_key("source", "sm_80"));
}

TEST(CacheFormat, RoundTrip) {
  auto k = fake_kernel("a");
  std::string why;
  auto back = KernelCache::deserialize(KernelCache::serialize("key1", k), "key1", &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->cubin, k.cubin);
  EXPECT_EQ(back->lowered_name, k.lowered_name);
  EXPECT_EQ(back->arch, k.arch);
  EXPECT_EQ(back->options, k.options);
}

TEST(CacheFormat, RejectsDamagedEntries) {
  const std::string good = KernelCache::serialize("key1", fake_kernel("a"));
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 0x40;  // inside the cubin
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  std::string bad_version = good;
  bad_version[8] = 99;
  std::string bad_header = good;
  bad_header[17] = '#';
  const Case cases[] = {{"empty", ""},
                        {"truncated header", good.substr(0, 20)},
                        {"truncated cubin", good.substr(0, good.size() - 1)},
                        {"extra bytes", good + "z"},
                        {"flipped byte", flipped},
                        {"wrong magic", bad_magic},
                        {"wrong version", bad_version},
                        {"malformed header", bad_header}};
  for (const auto& c : cases) {
    std::string why;
    EXPECT_FALSE(KernelCache::deserialize(c.bytes, "key1", &why)) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
  }
  std::string why;
  EXPECT_FALSE(KernelCache::deserialize(good, "another-key", &why));
  EXPECT_EQ(why, "key mismatch");
}

// Golden file: pins the on-disk format. If this fails after a format change, bump kFormatVersion
// and regenerate the golden file (BSJIT_UPDATE_GOLDEN=1).
TEST(CacheFormat, MatchesGoldenFile) {
  runtime::CompiledKernel k;
  k.cubin = {'\x7f', 'E', 'L', 'F', '\0', '\1', '\2', '\3'};
  k.lowered_name = "_Z10dsd_kernelIN16bsjit_generated6ConfigEEvPKT_";
  k.arch = "sm_90a";
  k.options = {"--gpu-architecture=sm_90a", "-std=c++17"};
  const std::string bytes = KernelCache::serialize("0123456789abcdef0123456789abcdef", k);
  const fs::path golden = fs::path(BSJIT_TEST_DATA) / ("cache_entry_v" + std::to_string(kFormatVersion) + ".bin");
  if (std::getenv("BSJIT_UPDATE_GOLDEN")) std::ofstream(golden, std::ios::binary) << bytes;
  ASSERT_TRUE(fs::exists(golden)) << golden << " is missing: a format version without a golden file";
  EXPECT_EQ(bytes, read(golden)) << "the cache entry format changed: bump kFormatVersion and add a golden file";
}

TEST(KernelCache, MemoryThenDiskThenCorruptRebuilt) {
  TempDir dir;
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return fake_kernel("k");
  };
  {
    KernelCache cache(dir.path);
    auto a = cache.get_or_compile("key-a", "forward-bf16-b32-last-sm_90", compile);
    auto b = cache.get_or_compile("key-a", "forward-bf16-b32-last-sm_90", compile);
    EXPECT_EQ(a, b);
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(cache.stats().memory_hits, 1);
    EXPECT_TRUE(fs::exists(cache.entry_path("key-a", "forward-bf16-b32-last-sm_90")));
  }
  {
    KernelCache fresh(dir.path);  // a new process, in effect
    auto k = fresh.get_or_compile("key-a", "forward-bf16-b32-last-sm_90", compile);
    EXPECT_EQ(compiles, 1);
    EXPECT_EQ(fresh.stats().disk_hits, 1);
    EXPECT_EQ(k->lowered_name, "_Z6kernelk");
  }
  {
    KernelCache fresh(dir.path);
    auto path = fresh.entry_path("key-a", "forward-bf16-b32-last-sm_90");
    std::string bytes = read(path);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
    fresh.get_or_compile("key-a", "forward-bf16-b32-last-sm_90", compile);
    EXPECT_EQ(compiles, 2);
    EXPECT_EQ(fresh.stats().bad_entries, 1);
    std::string why;
    EXPECT_TRUE(KernelCache::deserialize(read(path), "key-a", &why)) << "entry was rewritten whole: " << why;
  }
  // no temporary files left behind
  for (auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().extension(), ".bsjit") << e.path();
}

TEST(KernelCache, UnwritableDirectoryKeepsWorkingInMemory) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop root from writing";
  TempDir dir;
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  KernelCache cache(dir.path);
  int compiles = 0;
  auto k = cache.get_or_compile("key", "stem", [&] {
    ++compiles;
    return fake_kernel("r");
  });
  EXPECT_TRUE(k);
  cache.get_or_compile("key", "stem", [&] {
    ++compiles;
    return fake_kernel("r");
  });
  EXPECT_EQ(compiles, 1);
}

// A write that fails (here: a directory stands where the entry would go, which stops root too)
// is logged, and the kernel is served from memory.
TEST(KernelCache, FailedWriteKeepsWorkingInMemory) {
  TempDir dir;
  KernelCache cache(dir.path);
  fs::create_directories(cache.entry_path("key", "stem"));
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return fake_kernel("w");
  };
  EXPECT_TRUE(cache.get_or_compile("key", "stem", compile));
  EXPECT_TRUE(cache.get_or_compile("key", "stem", compile));
  EXPECT_EQ(compiles, 1);
  for (auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
}

TEST(KernelCache, DirectoryThatCannotExistMeansMemoryOnly) {
  TempDir dir;
  std::ofstream(dir.path / "file") << "x";
  KernelCache cache(dir.path / "file" / "sub");  // a path through a regular file
  EXPECT_TRUE(cache.entry_path("key", "stem").empty());
  int compiles = 0;
  cache.get_or_compile("key", "stem", [&] {
    ++compiles;
    return fake_kernel("m");
  });
  EXPECT_EQ(compiles, 1);
}

TEST(KernelCache, ConcurrentRequestsForOneKeyCompileOnce) {
  TempDir dir;
  KernelCache cache(dir.path);
  std::atomic<int> compiles{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i)
        cache.get_or_compile("key-" + std::to_string(i), "stem", [&] {
          ++compiles;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return fake_kernel("c");
        });
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 4);
  EXPECT_EQ(cache.stats().memory_hits, 8 * 4 - 4);
}

}  // namespace
}  // namespace bsjit::cache
