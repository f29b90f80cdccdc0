// On-disk entry, format version 5 (changing any of it requires bumping kFormatVersion):
//   8 bytes   magic "BSJITKC\0"
//   4 bytes   format version, little-endian uint32
//   4 bytes   header length H, little-endian uint32
//   H bytes   JSON header: key, label, arch, layout_hash, code_key, lowered_name, options, shared_bytes,
//             cubin_size, cubin_xxh64 (hex), tables ([[name, values], ...]: each table's symbol
//             and number of values), tables_xxh64 (hex, of the table bytes)
//   cubin_size bytes of cubin
//   the tables' values, table after table, each a little-endian int32
//   8 bytes   XXH3-64 of every byte before it, little-endian: the header is covered too (in version
//             4 a flipped lowered_name or shared-memory size went unnoticed, the entry then failing
//             at every load)
// Tuning records (<label>-<arch>-<key prefix>.tune) are JSON: {"key": ..., "tiles": {...}}.
// File name: <label>-<arch>-<first 16 key digits>.bsjit. Entries are written to a unique temporary
// file in the same directory, fsync'ed and renamed into place, so a reader sees nothing or a whole
// entry; a crash leaves at most a temporary file, which prune and clear remove. The file's mtime is
// the last-used stamp: the cache sets it on every first use in a process (atime is useless on
// relatime, noatime and network mounts).
#include "kernel_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "bsjit/error.hpp"
#include "generator/json_fields.hpp"
#include "generator/templates.hpp"

namespace bsjit::cache {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'B', 'S', 'J', 'I', 'T', 'K', 'C', '\0'};
constexpr const char* kEntryExt = ".bsjit";
constexpr const char* kLockExt = ".lock";
// A disk bound under this keeps no kernel (the smallest cache entries, of the FMA kernels, take
// some 20 KB): BSJIT_CACHE_MAX_SIZE below it is warned about.
constexpr std::uint64_t kSmallCacheBound = 64 * 1024;
constexpr const char* kTmpMark = ".tmp.";
constexpr const char* kTuneExt = ".tune";

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint32_t get_u32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string checksum(const char* data, std::size_t size) { return fmt::format("{:016x}", XXH3_64bits(data, size)); }
std::string checksum(const std::vector<char>& data) { return checksum(data.data(), data.size()); }

// The tables' values as the entry stores them.
std::string table_bytes(const generator::DeviceTables& tables) {
  std::string out;
  for (const auto& t : tables)
    for (int v : t.values) put_u32(out, static_cast<std::uint32_t>(v));
  return out;
}

std::string read_all(const fs::path& p, bool* ok) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  *ok = static_cast<bool>(in) || in.eof();
  return ss.str();
}

// The JSON header of an entry whose first bytes (the fixed fields and the header at least) are
// `bytes`, or nullopt with the reason in *why.
std::optional<nlohmann::json> header_json(const std::string& bytes, std::string* why) {
  auto fail = [why](std::string reason) {
    *why = std::move(reason);
    return std::nullopt;
  };
  if (bytes.empty()) return fail("empty file");
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return fail("not a bsjit cache entry (bad magic)");
  std::uint32_t version = get_u32(bytes, 8), header_size = get_u32(bytes, 12);
  if (version != kFormatVersion)
    return fail(fmt::format("stale: format version {}, this bsjit reads {}", version, kFormatVersion));
  if (16 + static_cast<std::size_t>(header_size) > bytes.size()) return fail("truncated header");
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 16, bytes.begin() + 16 + header_size, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return fail("malformed header");
  return h;
}

// The key and code key in the header of the entry at p (empty when it has none or is no entry),
// read without the cubin and tables.
std::pair<std::string, std::string> keys_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string bytes(16, '\0');
  if (!in.read(bytes.data(), 16)) return {};
  const std::uint32_t header_size = get_u32(bytes, 12);
  if (header_size > (1u << 20)) return {};
  bytes.resize(16 + header_size);
  std::string why;
  const auto h = in.read(bytes.data() + 16, header_size) ? header_json(bytes, &why) : std::nullopt;
  auto field = [&h](const char* name) {
    return h && h->contains(name) && (*h)[name].is_string() ? (*h)[name].get<std::string>() : std::string();
  };
  return {field("key"), field("code_key")};
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// Bytes from "N", "NK", "NM" or "NG" (N a decimal number ≥ 0, e.g. 1.5G), at most 2^60; anything
// else (a negative, nan, inf, 1e30, a stray suffix) throws std::invalid_argument.
std::uint64_t parse_size_or_throw(const std::string& text) {
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
    throw std::invalid_argument(text);  // (no sign, no "nan" or "inf")
  std::size_t used = 0;
  const double v = std::stod(text, &used);
  const std::string suffix = text.substr(used);
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) throw std::invalid_argument(text);
  const double bytes = v * mult;
  if (!(bytes >= 0) || bytes > 0x1p60) throw std::invalid_argument(text);
  return static_cast<std::uint64_t>(bytes);
}

bool is_entry(const fs::path& p) { return p.extension() == kEntryExt; }

// <label>-<arch>-<first 16 key digits>.bsjit
std::string entry_name(const std::string& label, const std::string& arch, const std::string& key) {
  return fmt::format("{}-{}-{}{}", label, arch, key.substr(0, 16), kEntryExt);
}
bool is_tmp(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.find(kTmpMark) != std::string::npos &&
         (name.find(".bsjit.tmp.") != std::string::npos || name.find(".tune.tmp.") != std::string::npos);
}

// The lock file serialising compiles of one key across processes. flock is released by close,
// also when the process dies.
struct FileLock {
  int fd = -1;
  explicit FileLock(const fs::path& path) {
    // like the entries: never through a link planted at the lock's name
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~FileLock() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// --- key and format --------------------------------------------------------------------------

KeyInputs key_inputs(const std::string& source, const generator::DeviceTables& tables, const std::string& arch) {
  static const std::string nvrtc = runtime::nvrtc_version();
  return {source,        generator::tables_digest(tables), generator::templates_hash(),
          arch,          runtime::compile_options(arch),   nvrtc,
          kFormatVersion};
}

std::string make_key(const KeyInputs& in) {
  // Each field is length-prefixed, so no two different inputs give the same material.
  std::string material;
  auto add = [&material](const std::string& field) { material += fmt::format("{}:{};", field.size(), field); };
  add(std::to_string(in.format_version));
  add(in.templates_hash);
  add(in.arch);
  add(std::to_string(in.options.size()));
  for (const auto& o : in.options) add(o);
  add(in.nvrtc_version);
  add(in.source);
  add(in.tables_digest);
  XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

std::string code_key(const std::string& source, const std::string& arch) {
  auto in = key_inputs(source, {}, arch);
  in.tables_digest.clear();  // no tables' digest is empty: a code key is never an entry's key
  return make_key(in);
}

std::string KernelCache::serialize(const Request& r, const runtime::CompiledKernel& k) {
  nlohmann::json h;
  h["key"] = r.key;
  h["label"] = r.label;
  h["arch"] = k.arch;
  h["layout_hash"] = r.layout_hash;
  h["code_key"] = r.code_key;
  h["lowered_name"] = k.lowered_name;
  h["options"] = k.options;
  h["shared_bytes"] = k.shared_bytes;
  h["cubin_size"] = k.cubin.size();
  h["cubin_xxh64"] = checksum(k.cubin);
  const std::string values = table_bytes(k.tables);
  h["tables"] = nlohmann::json::array();
  for (const auto& t : k.tables) h["tables"].push_back({t.name, t.values.size()});
  h["tables_xxh64"] = checksum(values.data(), values.size());
  std::string header = h.dump();
  std::string out(kMagic, sizeof kMagic);
  put_u32(out, kFormatVersion);
  put_u32(out, static_cast<std::uint32_t>(header.size()));
  out += header;
  out.append(k.cubin.data(), k.cubin.size());
  out += values;
  const std::uint64_t sum = XXH3_64bits(out.data(), out.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
  return out;
}

std::shared_ptr<runtime::CompiledKernel> KernelCache::deserialize(const std::string& bytes,
                                                                  const std::string& expected_key, std::string* why,
                                                                  EntryHeader* header) {
  auto fail = [why](std::string reason) {
    *why = std::move(reason);
    return nullptr;
  };
  const auto h = header_json(bytes, why);
  if (!h) return nullptr;
  if (bytes.size() < 16 + 8) return fail("truncated: no checksum");
  std::uint64_t sum = 0;
  for (int i = 0; i < 8; ++i)
    sum |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[bytes.size() - 8 + i])) << (8 * i);
  const std::size_t size = bytes.size() - 8;  // the entry without its checksum
  if (XXH3_64bits(bytes.data(), size) != sum) return fail("corrupt: entry checksum mismatch");
  const std::uint32_t header_size = get_u32(bytes, 12);
  try {
    EntryHeader e;
    e.key = h->at("key").get<std::string>();
    e.label = h->at("label").get<std::string>();
    e.arch = h->at("arch").get<std::string>();
    e.layout_hash = h->at("layout_hash").get<std::string>();
    e.code_key = h->at("code_key").get<std::string>();
    e.lowered_name = h->at("lowered_name").get<std::string>();
    e.options = h->at("options").get<std::vector<std::string>>();
    e.cubin_size = static_cast<std::uint64_t>(json_integer(h->at("cubin_size"), 0, INT64_MAX, "cubin_size"));
    e.cubin_xxh64 = h->at("cubin_xxh64").get<std::string>();
    e.shared_bytes = static_cast<int>(json_integer(h->at("shared_bytes"), 0, 1 << 20, "shared_bytes"));
    e.tables = h->at("tables").get<std::vector<std::pair<std::string, std::uint64_t>>>();
    e.tables_xxh64 = h->at("tables_xxh64").get<std::string>();
    if (header) *header = e;
    if (!expected_key.empty() && e.key != expected_key) return fail("foreign: the entry holds another key");
    std::uint64_t values = 0;
    for (const auto& [name, count] : e.tables) {
      if (count > (size / 4)) return fail(fmt::format("malformed header: table {} of {} values", name, count));
      values += count;
    }
    const std::uint64_t cubin_at = 16 + static_cast<std::uint64_t>(header_size), tables_at = cubin_at + e.cubin_size;
    if (e.cubin_size > size || values > size / 4 || size != tables_at + 4 * values)
      return fail(
          fmt::format("truncated or padded: {} bytes, header says {}", size, cubin_at + e.cubin_size + 4 * values));
    auto k = std::make_shared<runtime::CompiledKernel>();
    k->cubin.assign(bytes.begin() + static_cast<std::ptrdiff_t>(cubin_at),
                    bytes.begin() + static_cast<std::ptrdiff_t>(tables_at));
    if (checksum(k->cubin) != e.cubin_xxh64) return fail("corrupt: cubin checksum mismatch");
    if (checksum(bytes.data() + tables_at, 4 * values) != e.tables_xxh64)
      return fail("corrupt: tables checksum mismatch");
    std::size_t at = tables_at;
    for (const auto& [name, count] : e.tables) {
      auto& t = k->tables.emplace_back();
      t.name = name;
      t.values.resize(count);
      for (auto& v : t.values) v = static_cast<int>(get_u32(bytes, at)), at += 4;
    }
    k->lowered_name = e.lowered_name;
    k->arch = e.arch;
    k->options = e.options;
    k->shared_bytes = e.shared_bytes;
    return k;
  } catch (const nlohmann::json::exception& ex) {
    return fail(std::string("malformed header: ") + ex.what());
  } catch (const Error& ex) {  // a field of the wrong kind (json_integer)
    return fail(std::string("malformed header: ") + ex.what());
  }
}

std::string insecure_reason(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // missing: nothing to trust or distrust yet
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    return fmt::format("'{}' is owned by uid {}, not by this user (uid {}) or root", path.string(), st.st_uid, me);
  if (st.st_mode & S_IWOTH) return fmt::format("'{}' is writable by all users (mode {:o})", path.string(), st.st_mode & 07777);
  if (st.st_mode & S_IWGRP) return fmt::format("'{}' is writable by its group (mode {:o})", path.string(), st.st_mode & 07777);
  return "";
}

// --- configuration ---------------------------------------------------------------------------

// Whether a cache directory may be used: no one else can write there (insecure_reason), or the
// configuration accepts that; logs why not.
bool KernelCache::trusted_directory(const fs::path& dir, const char* role) const {
  std::string why = insecure_reason(dir);
  if (why.empty()) return true;
  if (config_.allow_insecure) {
    spdlog::warn("bsjit: using {} cache directory although {} (allow_insecure is set)", role, why);
    return true;
  }
  spdlog::error(
      "bsjit: refusing {} cache directory: {}. Whoever can write there can make this process run their "
      "GPU code. Fix the ownership or permissions, or set BSJIT_CACHE_ALLOW_INSECURE=1 to accept it.",
      role, why);
  return false;
}

KernelCache::KernelCache(CacheConfig config) { configure(std::move(config)); }

void KernelCache::configure(CacheConfig config) {
  std::lock_guard lock(mutex_);
  config_ = std::move(config);
  directory_bytes_.reset();
  writable_ = false;
  readable_.clear();
  // The writable directory is created when the first entry is written (open_directory_locked), not
  // here: a process that sets another directory, or none, never creates the default one.
  pending_ = !config_.directory.empty();
  if (pending_ && fs::is_directory(config_.directory)) open_directory_locked();
  for (const auto& dir : config_.read_only) {
    if (!fs::is_directory(dir)) {
      spdlog::warn("bsjit: read-only cache directory '{}' does not exist; skipped", dir.string());
      continue;
    }
    if (trusted_directory(dir, "read-only")) readable_.push_back(dir);
  }
}

// Creates the writable directory if need be and checks it (trusted, writable); mutex_ held. Once per
// configuration: after it the directory is in use (readable_, writable_) or refused with a warning.
void KernelCache::open_directory_locked() {
  pending_ = false;
  std::error_code ec;
  fs::create_directories(config_.directory, ec);
  if (ec || !fs::is_directory(config_.directory)) {
    spdlog::warn("bsjit: cache directory '{}' cannot be created ({}); kernels are kept in memory only",
                 config_.directory.string(), ec ? ec.message() : "not a directory");
    return;
  }
  if (!trusted_directory(config_.directory, "the")) return;
  readable_.insert(readable_.begin(), config_.directory);  // searched first
  writable_ = ::access(config_.directory.c_str(), W_OK) == 0;
  if (!writable_)
    spdlog::warn("bsjit: cache directory '{}' is read-only; new kernels are kept in memory only",
                 config_.directory.string());
}

CacheConfig KernelCache::config() const {
  std::lock_guard lock(mutex_);
  return config_;
}

std::filesystem::path KernelCache::entry_path(const Request& r) {
  std::lock_guard lock(mutex_);
  if (pending_) open_directory_locked();
  if (!writable_) return {};
  return config_.directory / entry_name(r.label, r.arch, r.key);
}

CacheStats KernelCache::stats() const {
  return {memory_hits_.load(), disk_hits_.load(), compiles_.load(), shared_compiles_.load(), bad_entries_.load()};
}

// --- lookup ----------------------------------------------------------------------------------

KernelCache::Compiled KernelCache::load_from(const fs::path& path, const std::string& key, bool writable_layer,
                                             bool quiet) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return nullptr;
  std::string why = insecure_reason(path);
  bool allow_insecure;
  {
    std::lock_guard lock(mutex_);
    allow_insecure = config_.allow_insecure;
  }
  if (!why.empty() && !allow_insecure) {
    if (quiet) return nullptr;
    ++bad_entries_;
    spdlog::error("bsjit: refusing cache entry: {}; rebuilding it in memory", why);
    return nullptr;
  }
  bool ok = false;
  std::string bytes = read_all(path, &ok);
  auto k = ok ? deserialize(bytes, key, &why) : nullptr;
  if (!ok) why = "unreadable";
  if (!k) {
    if (quiet) return nullptr;
    ++bad_entries_;
    spdlog::warn("bsjit: cache entry '{}' is unusable ({}); rebuilding it", path.string(), why);
    return nullptr;
  }
  if (writable_layer) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // last-used stamp = now
  return k;
}

KernelCache::Compiled KernelCache::load_from_layers(const Request& r, bool quiet) {
  std::vector<fs::path> layers;
  fs::path writable_dir;
  {
    std::lock_guard lock(mutex_);
    layers = readable_;
    if (writable_) writable_dir = config_.directory;
  }
  const std::string name = entry_name(r.label, r.arch, r.key);
  for (const auto& dir : layers)
    if (auto k = load_from(dir / name, r.key, dir == writable_dir, quiet)) {
      spdlog::debug("bsjit: {} for {} read from {}", r.label, r.arch, (dir / name).string());
      return k;
    }
  return nullptr;
}

KernelCache::Compiled KernelCache::code_from_layers(const Request& r) {
  std::vector<fs::path> layers;
  {
    std::lock_guard lock(mutex_);
    layers = readable_;
  }
  // Entries of one code key have one label and arch, the start of their file names.
  const std::string prefix = fmt::format("{}-{}-", r.label, r.arch);
  for (const auto& dir : layers) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& path = it->path();
      if (!is_entry(path) || !path.filename().string().starts_with(prefix)) continue;
      const auto [key, code_key] = keys_of(path);
      // read whole, verified and trusted as any entry (load_from)
      if (code_key == r.code_key)
        if (auto k = load_from(path, key, false, true)) return k;
    }
  }
  return nullptr;
}

bool KernelCache::write_atomically(const fs::path& path, const std::string& bytes) {
  std::random_device rd;
  fs::path tmp = path;
  tmp += fmt::format(".tmp.{}.{:08x}", ::getpid(), rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::fchmod(fd, 0644) == 0;  // not group-writable whatever the umask
  std::size_t done = 0;
  while (ok && done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) ok = false;
    else done += static_cast<std::size_t>(n);
  }
  if (ok) ok = ::fsync(fd) == 0;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  const bool written = ok;  // the temporary file is whole: what fails after this is the entry's own
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;  // atomic; losing a race to an equal file is fine
  if (!ok) {
    int err = errno;
    ::unlink(tmp.c_str());
    std::lock_guard lock(mutex_);
    if (written) {
      // Something at the entry's name (a directory), or the temporary file removed meanwhile (`cache
      // clear`): this entry is not stored; the directory stays in use for the others.
      spdlog::warn("bsjit: cannot store cache entry '{}' ({}); it is kept in memory", path.string(),
                   std::strerror(err));
    } else if (writable_) {  // the directory itself (read-only, full, refused): warn once, then stop trying
      writable_ = false;
      spdlog::warn("bsjit: cannot write to cache directory '{}' ({}); new kernels are kept in memory only",
                   config_.directory.string(), std::strerror(err));
    }
  }
  return ok;
}

namespace {

// Removes the least recently used entries of directory, and their lock files, until the entries
// take at most `target` bytes, when they take more than max_bytes; returns the bytes left. Reads
// file sizes and last-used stamps only, not the entries (prune_cache, which also drops invalid
// and old entries, reads and verifies every one).
std::uint64_t shrink_directory(const fs::path& directory, std::uint64_t max_bytes, std::uint64_t target) {
  struct Stat {
    fs::file_time_type used;
    std::uint64_t bytes;
    fs::path path;
  };
  std::vector<Stat> entries;
  std::uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code stat_ec;
    if (!is_entry(it->path()) || !it->is_regular_file(stat_ec)) continue;
    Stat e{it->last_write_time(stat_ec), it->file_size(stat_ec), it->path()};
    if (stat_ec) continue;  // gone meanwhile (another process pruned it)
    total += e.bytes;
    entries.push_back(std::move(e));
  }
  if (total <= max_bytes) return total;
  std::sort(entries.begin(), entries.end(), [](const Stat& a, const Stat& b) { return a.used < b.used; });
  for (const auto& e : entries) {
    if (total <= target) break;
    std::error_code rm_ec;
    if (fs::remove(e.path, rm_ec)) total -= e.bytes;
    fs::path lock = e.path;
    fs::remove(lock.replace_extension(kLockExt), rm_ec);
  }
  return total;
}

}  // namespace

KernelCache::DiskWrites KernelCache::disk_writes() const {
  std::lock_guard lock(mutex_);
  return disk_writes_;
}

void KernelCache::record_writes(bool on) {
  std::lock_guard lock(mutex_);
  recordings_ += on ? 1 : -1;
  if (recordings_ == 0) disk_writes_.written.clear();
}

void KernelCache::store(const Request& r, const runtime::CompiledKernel& k) {
  fs::path path = entry_path(r);
  const std::string bytes = path.empty() ? std::string() : serialize(r, k);
  if (path.empty() || !write_atomically(path, bytes)) {
    std::lock_guard lock(mutex_);
    ++disk_writes_.not_written;
    return;
  }
  const std::uint64_t entry_bytes = bytes.size();
  std::uint64_t max_bytes;
  {
    std::lock_guard lock(mutex_);
    if (recordings_ > 0) disk_writes_.written.push_back(path);
    max_bytes = config_.max_bytes;
    // within the bound by this process's count: no need to look at the directory
    if (max_bytes == 0 || (directory_bytes_ && *directory_bytes_ + entry_bytes <= max_bytes)) {
      if (directory_bytes_) *directory_bytes_ += entry_bytes;
      return;
    }
  }
  // Over it, or not counted yet (this process's first store): count the directory, and when it
  // is over, remove the least recently used down to 7/8 of the bound, so that the next count is
  // an eighth of the bound of writes away instead of at every store.
  const std::uint64_t left = shrink_directory(path.parent_path(), max_bytes, max_bytes - max_bytes / 8);
  std::lock_guard lock(mutex_);
  directory_bytes_ = left;
}

std::string KernelCache::find_tuning(const std::string& key, const std::string& stem) {
  std::vector<fs::path> layers;
  {
    std::lock_guard lock(mutex_);
    if (auto it = tunings_.find(key); it != tunings_.end()) return it->second;
    layers = readable_;
  }
  const std::string name = fmt::format("{}-{}{}", stem, key.substr(0, 16), kTuneExt);  // as store_tuning names it
  for (const auto& dir : layers) {
    const fs::path path = dir / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    bool ok = false;
    std::string text = read_all(path, &ok);
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (!ok || j.is_discarded() || !j.is_object() || j.value("key", "") != key || !insecure_reason(path).empty()) {
      spdlog::warn("bsjit: tuning record '{}' is unusable; ignored", path.string());
      continue;
    }
    std::lock_guard lock(mutex_);
    return tunings_[key] = text;
  }
  return "";
}

void KernelCache::store_tuning(const std::string& key, const std::string& stem, const std::string& json) {
  {
    std::lock_guard lock(mutex_);
    tunings_[key] = json;
  }
  fs::path dir;
  {
    std::lock_guard lock(mutex_);
    if (pending_) open_directory_locked();
    if (!writable_) return;
    dir = config_.directory;
  }
  write_atomically(dir / fmt::format("{}-{}{}", stem, key.substr(0, 16), kTuneExt), json);
}

template <class S>
std::shared_ptr<S> KernelCache::slot_in(std::unordered_map<std::string, std::shared_ptr<S>>& slots,
                                        const std::string& key) {
  std::lock_guard lock(mutex_);
  auto& s = slots[key];
  if (!s) s = std::make_shared<S>();
  return s;
}

void KernelCache::trim_memory() {
  std::lock_guard lock(mutex_);
  if (slots_.size() <= 2 * kMemoryEntries) return;
  // forgettable: no get in flight for it (the map holds the only slot pointer) and nobody else
  // holds its kernel
  std::vector<std::pair<std::uint64_t, std::string>> idle;
  for (const auto& [key, slot] : slots_)
    if (slot.use_count() == 1 && slot->kernel && slot->kernel.use_count() == 1) idle.emplace_back(slot->used, key);
  const std::size_t keep = slots_.size() - std::min(idle.size(), slots_.size() - kMemoryEntries);
  std::sort(idle.begin(), idle.end());  // least recently used first
  for (std::size_t i = 0; slots_.size() > keep; ++i) slots_.erase(idle[i].second);
}

KernelCache::Compiled KernelCache::get(const Request& r, OnMiss on_miss, bool* compiled_now) {
  if (compiled_now) *compiled_now = false;
  auto slot = slot_in(slots_, r.key);
  std::lock_guard slot_lock(slot->mutex);  // only this key waits; other keys proceed
  {
    std::lock_guard lock(mutex_);
    slot->used = ++use_clock_;
  }
  if (slot->kernel) {
    ++memory_hits_;
    return slot->kernel;
  }
  struct Trim {  // after this call's new entry is in its slot (and returned to the caller)
    KernelCache* cache;
    ~Trim() { cache->trim_memory(); }
  } trim{this};
  if (auto k = load_from_layers(r, false)) return slot->kernel = loaded(r, k);
  if (on_miss == OnMiss::fail) {  // strict mode: proves a deployment's cache is complete
    auto c = config();
    std::vector<std::string> dirs;
    if (!c.directory.empty()) dirs.push_back(c.directory.string());
    for (auto& d : c.read_only) dirs.push_back(d.string());
    throw Error(
        fmt::format("bsjit: strict cache: kernel {} for {} (key {}) is in no cache directory [{}]; "
                    "precompile it (bsjit precompile) or turn strict mode off (BSJIT_STRICT_CACHE){}",
                    r.label, r.arch, r.key, fmt::join(dirs, ", "), r.miss_hint));
  }
  // Another process may be compiling the same key: wait for it, then look again. Where the code is
  // in memory (a new layout of a shape built before), the build takes milliseconds: nothing to wait
  // for, and no lock file (whose creation took 0.1-0.4 ms an entry on the 2-core machine).
  const bool from_memory = code_in_memory(r.code_key);
  std::unique_ptr<FileLock> lock;
  if (auto path = entry_path(r); !path.empty() && !from_memory) {
    lock = std::make_unique<FileLock>(path.replace_extension(kLockExt));
    if (auto k = load_from_layers(r, true))  // quiet: a bad entry was reported above already
      return slot->kernel = loaded(r, k);
  }
  bool shared = false;
  auto k = build(r, &shared);
  if (compiled_now) *compiled_now = true;
  if (!shared || on_miss != OnMiss::compile_at_run) store(r, *k);  // (OnMiss: why not at run time)
  return slot->kernel = k;
}

bool KernelCache::code_in_memory(const std::string& code_key) {
  if (code_key.empty()) return false;
  std::shared_ptr<CodeSlot> slot;
  {
    std::lock_guard lock(mutex_);
    auto it = code_slots_.find(code_key);
    if (it == code_slots_.end()) return false;
    slot = it->second;
  }
  std::lock_guard code_lock(slot->mutex);  // after the entry's slot lock, as in build
  return slot->kernel != nullptr;
}

KernelCache::Compiled KernelCache::loaded(const Request& r, Compiled k) {
  ++disk_hits_;
  offer_code(r.code_key, k);
  return k;
}

void KernelCache::offer_code(const std::string& code_key, const Compiled& k) {
  if (code_key.empty()) return;
  auto slot = slot_in(code_slots_, code_key);
  std::lock_guard code_lock(slot->mutex);
  if (!slot->kernel) slot->kernel = k;
}

std::shared_ptr<runtime::CompiledKernel> KernelCache::compile_now(const Request& r) {
  auto k = std::make_shared<runtime::CompiledKernel>(r.compile());
  ++compiles_;
  k->tables = r.tables;
  return k;
}

std::shared_ptr<runtime::CompiledKernel> KernelCache::with_code_of(const runtime::CompiledKernel& code,
                                                                   const Request& r) {
  auto k = std::make_shared<runtime::CompiledKernel>(code);
  ++shared_compiles_;
  k->tables = r.tables;
  return k;
}

std::shared_ptr<runtime::CompiledKernel> KernelCache::build(const Request& r, bool* shared) {
  *shared = false;
  if (r.code_key.empty()) return compile_now(r);
  auto slot = slot_in(code_slots_, r.code_key);
  std::lock_guard code_lock(slot->mutex);  // taken after the entry's slot lock, never before
  if (!slot->kernel) slot->kernel = code_from_layers(r);
  if (const auto& code = slot->kernel) {
    *shared = true;
    return with_code_of(*code, r);
  }
  auto k = compile_now(r);
  slot->kernel = k;
  return k;
}

KernelCache::Compiled KernelCache::rebuild(const Request& r, const Compiled& refused, OnMiss on_miss) {
  auto slot = slot_in(slots_, r.key);
  std::lock_guard slot_lock(slot->mutex);
  if (slot->kernel && slot->kernel != refused) return slot->kernel;  // replaced by another caller
  const fs::path path = entry_path(r);
  if (on_miss == OnMiss::fail)
    throw Error(fmt::format(
        "bsjit: strict cache: the driver refuses kernel {} for {} (key {}) as its cache entry holds it{}{}; "
        "strict mode compiles nothing at run time: precompile it again (bsjit precompile) after removing the entry",
        r.label, r.arch, r.key, path.empty() ? "" : " at ", path.string()));
  ++bad_entries_;
  spdlog::warn("bsjit: the driver refuses cached kernel {} for {} (key {}); compiling it again{}{}", r.label, r.arch,
               r.key, path.empty() ? "" : " and replacing ", path.string());
  std::shared_ptr<runtime::CompiledKernel> k;
  if (r.code_key.empty()) {
    k = compile_now(r);
  } else {  // the refused code serves no other layout of the shape either; code rebuilt for one serves all
    auto code = slot_in(code_slots_, r.code_key);
    std::lock_guard code_lock(code->mutex);
    if (code->kernel && code->kernel->cubin != refused->cubin)
      k = with_code_of(*code->kernel, r);
    else
      code->kernel = k = compile_now(r);
  }
  std::unique_ptr<FileLock> lock;
  if (!path.empty()) lock = std::make_unique<FileLock>(fs::path(path).replace_extension(kLockExt));
  store(r, *k);
  return slot->kernel = k;
}

void KernelCache::insert(const std::string& key, Compiled kernel, const std::string& code_key) {
  auto slot = slot_in(slots_, key);
  std::lock_guard slot_lock(slot->mutex);
  if (!slot->kernel) slot->kernel = std::move(kernel);
  offer_code(code_key, slot->kernel);
}

KernelCache& KernelCache::global() {
  static KernelCache cache(default_cache_config());
  return cache;
}

}  // namespace bsjit::cache

// --- public functions ----------------------------------------------------------------------------

namespace bsjit {

namespace fs = std::filesystem;

fs::path default_cache_directory() {
  if (const char* d = std::getenv("BSJIT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "bsjit";
  if (const char* d = std::getenv("HOME"); d && *d) return fs::path(d) / ".cache" / "bsjit";
  return {};
}

CacheConfig default_cache_config() {
  CacheConfig c;
  c.directory = default_cache_directory();
  if (const char* p = std::getenv("BSJIT_CACHE_PATH"); p && *p) {
    std::stringstream ss(p);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) c.read_only.emplace_back(item);
  }
  if (const char* m = std::getenv("BSJIT_CACHE_MAX_SIZE"); m && *m) {
    try {
      c.max_bytes = cache::parse_size_or_throw(m);
      if (c.max_bytes < cache::kSmallCacheBound)
        spdlog::warn(
            "bsjit: BSJIT_CACHE_MAX_SIZE='{}' is {} bytes, less than one kernel: the disk cache will keep "
            "nothing",
            m, c.max_bytes);
    } catch (const std::exception&) {
      spdlog::warn("bsjit: BSJIT_CACHE_MAX_SIZE='{}' is not a size (e.g. 2G, 500M); no bound is set", m);
    }
  }
  c.strict = cache::env_flag("BSJIT_STRICT_CACHE");
  c.allow_insecure = cache::env_flag("BSJIT_CACHE_ALLOW_INSECURE");
  return c;
}

std::uint64_t parse_byte_size(const std::string& text) {
  try {
    return cache::parse_size_or_throw(text);
  } catch (const std::exception&) {
    throw Error(fmt::format("'{}' is not a size; expected bytes with an optional K, M or G suffix, e.g. 500M", text));
  }
}

void configure_cache(const CacheConfig& config) { cache::KernelCache::global().configure(config); }
CacheConfig cache_config() { return cache::KernelCache::global().config(); }
void set_cache_directory(const fs::path& directory) {
  auto c = cache_config();
  c.directory = directory;
  configure_cache(c);
}
fs::path cache_directory() { return cache_config().directory; }
void set_strict_cache(bool strict) {
  auto c = cache_config();
  c.strict = strict;
  configure_cache(c);
}
CacheStats cache_stats() { return cache::KernelCache::global().stats(); }

std::vector<CacheEntryInfo> list_cache(const fs::path& directory) {
  std::vector<CacheEntryInfo> out;
  std::error_code ec;
  const bool allow_insecure = cache::KernelCache::global().config().allow_insecure;
  for (const auto& e : fs::directory_iterator(directory, ec)) {
    if (!cache::is_entry(e.path())) continue;
    CacheEntryInfo info;
    info.path = e.path();
    std::error_code stat_ec;
    info.last_used = std::chrono::file_clock::to_sys(e.last_write_time(stat_ec));
    // the loader's rules (load_from): a regular file that no one else can write, unless allowed
    if (!e.is_regular_file(stat_ec) || fs::is_symlink(e.symlink_status(stat_ec))) {
      info.problem = "not a regular file (something else sits at an entry's name)";
      out.push_back(std::move(info));
      continue;
    }
    info.bytes = e.file_size(stat_ec);
    if (std::string unsafe = cache::insecure_reason(e.path()); !unsafe.empty() && !allow_insecure) {
      info.problem = "refused by the loader: " + unsafe;
      out.push_back(std::move(info));
      continue;
    }
    bool ok = false;
    std::string bytes = cache::read_all(e.path(), &ok);
    cache::EntryHeader h;
    std::string why;
    info.valid = ok && cache::KernelCache::deserialize(bytes, "", &why, &h) != nullptr;
    if (!ok) why = "unreadable";
    if (info.valid) {
      // the name must match the header, or the entry would be found under another key
      if (e.path().filename() != cache::entry_name(h.label, h.arch, h.key)) {
        info.valid = false;
        why = "file name does not match its header";
      }
    }
    info.problem = info.valid ? "" : why;
    info.key = h.key;
    info.label = h.label;
    info.arch = h.arch;
    info.layout_hash = h.layout_hash;
    info.lowered_name = h.lowered_name;
    out.push_back(std::move(info));
  }
  if (ec) throw Error(fmt::format("cannot list cache directory '{}': {}", directory.string(), ec.message()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.last_used > b.last_used; });
  return out;
}

namespace {
void remove_counted(const fs::path& p, PruneResult& r) {
  std::error_code ec;
  auto size = fs::file_size(p, ec);
  if (fs::remove(p, ec)) {
    ++r.removed;
    r.bytes_removed += ec ? 0 : size;
  }
}
}  // namespace

PruneResult prune_cache(const fs::path& directory, std::uint64_t max_bytes, std::chrono::seconds max_age) {
  PruneResult r;
  const auto now = std::chrono::system_clock::now();
  std::error_code ec;
  // temporary files of writers that died more than an hour ago
  for (const auto& e : fs::directory_iterator(directory, ec))
    if (cache::is_tmp(e.path()) && now - std::chrono::file_clock::to_sys(e.last_write_time(ec)) > std::chrono::hours(1))
      remove_counted(e.path(), r);
  auto entries = list_cache(directory);  // most recently used first
  std::uint64_t total = 0;
  bool full = false;  // once one entry does not fit, every less recently used one goes too
  for (const auto& e : entries) {
    bool too_old = max_age.count() > 0 && now - e.last_used > max_age;
    full = full || (max_bytes > 0 && total + e.bytes > max_bytes);
    if (!e.valid || too_old || full) {
      remove_counted(e.path, r);
      continue;
    }
    total += e.bytes;
  }
  r.bytes_left = total;
  return r;
}

PruneResult clear_cache(const fs::path& directory) {
  PruneResult r;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(directory, ec)) {
    const auto& p = e.path();
    if (cache::is_entry(p) || cache::is_tmp(p) || p.extension() == cache::kLockExt || p.extension() == cache::kTuneExt)
      remove_counted(p, r);
  }
  if (ec) throw Error(fmt::format("cannot clear cache directory '{}': {}", directory.string(), ec.message()));
  return r;
}

}  // namespace bsjit
