// On-disk entry, format version 1 (changing any of it requires bumping kFormatVersion):
//   8 bytes   magic "BSJITKC\0"
//   4 bytes   format version, little-endian uint32
//   4 bytes   header length H, little-endian uint32
//   H bytes   JSON header: key, lowered_name, arch, options, cubin_size, cubin_xxh64 (hex)
//   cubin_size bytes of cubin
// Entries are written to a unique temporary file in the same directory and renamed into place, so
// a reader sees either nothing or a whole entry.
#include "kernel_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bsjit/error.hpp"
#include "generator/templates.hpp"

namespace bsjit::cache {
namespace {

constexpr char kMagic[8] = {'B', 'S', 'J', 'I', 'T', 'K', 'C', '\0'};

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint32_t get_u32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string checksum(const std::vector<char>& data) {
  return fmt::format("{:016x}", XXH3_64bits(data.data(), data.size()));
}

}  // namespace

std::string make_key(const std::string& source, const std::string& arch) {
  std::string material = fmt::format("bsjit-cache-format {}\n", kFormatVersion);
  material += "templates " + generator::templates_hash() + "\n";
  material += "arch " + arch + "\n";
  for (const auto& o : runtime::compile_options(arch)) material += "option " + o + "\n";
  material += "nvrtc " + runtime::nvrtc_version() + "\n";
  material += source;
  XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

KernelCache::KernelCache(std::filesystem::path directory) { set_directory(std::move(directory)); }

void KernelCache::set_directory(std::filesystem::path directory) {
  std::lock_guard lock(mutex_);
  directory_ = std::move(directory);
  disk_usable_ = !directory_.empty();
  if (disk_usable_) {
    std::error_code ec;
    std::filesystem::create_directories(directory_, ec);
    if (ec || !std::filesystem::is_directory(directory_)) {
      spdlog::warn("bsjit: cache directory '{}' cannot be created ({}); kernels are kept in memory only",
                   directory_.string(), ec.message());
      disk_usable_ = false;
    }
  }
}

std::filesystem::path KernelCache::directory() const {
  std::lock_guard lock(mutex_);
  return directory_;
}

std::filesystem::path KernelCache::entry_path(const std::string& key, const std::string& file_stem) const {
  std::lock_guard lock(mutex_);
  if (!disk_usable_) return {};
  return directory_ / fmt::format("{}-{}.bsjit", file_stem, key.substr(0, 16));
}

CacheStats KernelCache::stats() const {
  return {memory_hits_.load(), disk_hits_.load(), compiles_.load(), bad_entries_.load()};
}

std::string KernelCache::serialize(const std::string& key, const runtime::CompiledKernel& k) {
  nlohmann::json h;
  h["key"] = key;
  h["lowered_name"] = k.lowered_name;
  h["arch"] = k.arch;
  h["options"] = k.options;
  h["cubin_size"] = k.cubin.size();
  h["cubin_xxh64"] = checksum(k.cubin);
  std::string header = h.dump();
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kFormatVersion);
  put_u32(out, static_cast<std::uint32_t>(header.size()));
  out += header;
  out.append(k.cubin.data(), k.cubin.size());
  return out;
}

std::shared_ptr<runtime::CompiledKernel> KernelCache::deserialize(const std::string& bytes, const std::string& key,
                                                                  std::string* why) {
  auto fail = [why](std::string reason) {
    *why = std::move(reason);
    return nullptr;
  };
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return fail("bad magic");
  std::uint32_t version = get_u32(bytes, 8), header_size = get_u32(bytes, 12);
  if (version != kFormatVersion) return fail(fmt::format("format version {} (expected {})", version, kFormatVersion));
  if (16 + static_cast<std::size_t>(header_size) > bytes.size()) return fail("truncated header");
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 16, bytes.begin() + 16 + header_size, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return fail("malformed header");
  try {
    if (h.at("key").get<std::string>() != key) return fail("key mismatch");
    auto k = std::make_shared<runtime::CompiledKernel>();
    k->lowered_name = h.at("lowered_name").get<std::string>();
    k->arch = h.at("arch").get<std::string>();
    k->options = h.at("options").get<std::vector<std::string>>();
    std::size_t size = h.at("cubin_size").get<std::size_t>();
    if (bytes.size() != 16 + header_size + size) return fail("cubin size does not match the file size");
    k->cubin.assign(bytes.begin() + 16 + header_size, bytes.end());
    if (checksum(k->cubin) != h.at("cubin_xxh64").get<std::string>()) return fail("cubin checksum mismatch");
    return k;
  } catch (const nlohmann::json::exception& e) {
    return fail(std::string("malformed header: ") + e.what());
  }
}

KernelCache::Compiled KernelCache::load_from_disk(const std::string& key, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string why;
  auto k = deserialize(ss.str(), key, &why);
  if (!k) {
    ++bad_entries_;
    spdlog::warn("bsjit: cache entry '{}' is unusable ({}); rebuilding it", path.string(), why);
  }
  return k;
}

void KernelCache::store_to_disk(const std::string& key, const std::filesystem::path& path,
                                const runtime::CompiledKernel& k) {
  std::string bytes = serialize(key, k);
  std::random_device rd;
  auto tmp = path;
  tmp += fmt::format(".tmp.{}.{:08x}", getpid(), rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  std::size_t done = 0;
  while (ok && done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) ok = false;
    else done += static_cast<std::size_t>(n);
  }
  if (ok) ok = ::fsync(fd) == 0;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    int err = errno;
    ::unlink(tmp.c_str());
    spdlog::warn("bsjit: cannot write cache entry '{}' ({}); continuing with the kernel in memory", path.string(),
                 std::strerror(err));
  }
}

KernelCache::Compiled KernelCache::get_or_compile(const std::string& key, const std::string& file_stem,
                                                  const std::function<runtime::CompiledKernel()>& compile) {
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard lock(mutex_);
    auto& s = slots_[key];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  std::lock_guard slot_lock(slot->mutex);  // only this key waits; other keys proceed
  if (slot->kernel) {
    ++memory_hits_;
    return slot->kernel;
  }
  auto path = entry_path(key, file_stem);
  if (!path.empty()) {
    if (auto k = load_from_disk(key, path)) {
      ++disk_hits_;
      return slot->kernel = k;
    }
  }
  auto k = std::make_shared<runtime::CompiledKernel>(compile());
  ++compiles_;
  if (!path.empty()) store_to_disk(key, path, *k);
  return slot->kernel = k;
}

KernelCache& KernelCache::global() {
  static KernelCache cache(default_cache_directory());
  return cache;
}

}  // namespace bsjit::cache

namespace bsjit {

std::filesystem::path default_cache_directory() {
  if (const char* d = std::getenv("BSJIT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::filesystem::path(d) / "bsjit";
  if (const char* d = std::getenv("HOME"); d && *d) return std::filesystem::path(d) / ".cache" / "bsjit";
  return {};
}

void set_cache_directory(const std::filesystem::path& directory) { cache::KernelCache::global().set_directory(directory); }
std::filesystem::path cache_directory() { return cache::KernelCache::global().directory(); }
CacheStats cache_stats() { return cache::KernelCache::global().stats(); }

}  // namespace bsjit
