// Precompilation and warm-up over a manifest, and warm-up of a cache directory.
#include "bsjit/deploy.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "bsjit/attention.hpp"
#include "bsjit/attention_ops.hpp"
#include "bsjit/cache.hpp"
#include "bsjit/conv.hpp"
#include "bsjit/error.hpp"
#include "bsjit/layout.hpp"
#include "bsjit/matmul.hpp"
#include "driver.hpp"
#include "generator/json_fields.hpp"
#include "kernel_registry.hpp"
#include "module.hpp"
#include "parallel.hpp"

namespace bsjit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

template <class T, class Parse>
std::vector<T> list_of(const nlohmann::json& group, const char* name, std::vector<T> fallback, Parse parse) {
  if (!group.contains(name)) return fallback;
  const auto& v = group.at(name);
  if (!v.is_array()) throw Error(fmt::format("manifest: '{}' must be a list", name));
  std::vector<T> out;
  for (const auto& item : v) out.push_back(parse(item));
  return out;
}

// One kernel of a manifest.
struct Item {
  std::size_t layout;  // index into the loaded layouts
  Op op;
  MatMulOptions options;
  Calls calls;
  std::string what;
};

// One combination of an attention group: its kernels (fused: forward and backward; or decomposed).
struct AttentionItem {
  std::vector<std::size_t> masks;  // indices into the loaded layouts
  AttentionOptions options;
  bool decomposed = false;
  std::string what;
};

// One combination of a conv group: the three kernels of a layout, filter, dtype, order and arch.
struct ConvItem {
  std::shared_ptr<ConvLayout> layout;  // null where the file failed to load
  std::string load_error;
  std::array<int, 3> filter;
  ConvOptions options;
  std::string what;
  // A geometry of the filter's taps: the kernels depend on nothing else of it.
  Conv conv() const {
    if (!layout) throw Error(load_error);
    const std::array<std::int64_t, 3> f{filter[0], filter[1], filter[2]};
    return Conv(*layout, ConvGeometry::valid(f, f), options);
  }
};

struct Expanded {
  std::vector<fs::path> files;
  std::vector<std::shared_ptr<Layout>> layouts;  // null where the file failed to load or holds heads
  std::vector<std::vector<Layout>> heads;        // a file's masks: one, or one per head (a 3-D .npy)
  std::vector<std::string> load_errors;
  std::vector<Item> items;
  std::vector<AttentionItem> attention;
  std::vector<ConvItem> conv;

  std::size_t file_index(const fs::path& file) {
    for (std::size_t i = 0; i < files.size(); ++i)
      if (files[i] == file) return i;
    files.push_back(file);
    try {
      heads.push_back(Layout::load_heads(file));
      const bool one = heads.back().size() == 1;
      layouts.push_back(one ? std::make_shared<Layout>(heads.back().front()) : nullptr);
      load_errors.push_back(one ? ""
                                : fmt::format("'{}' holds {} attention masks ([heads, rows, cols]), not a "
                                              "matmul layout",
                                              file.string(), heads.back().size()));
    } catch (const Error& err) {
      heads.emplace_back();
      layouts.push_back(nullptr);
      load_errors.push_back(err.what());
    }
    return files.size() - 1;
  }
  // The masks of an attention item (a 3-D file: its heads); throws the first load error.
  std::vector<Layout> masks_of(const AttentionItem& item) const {
    std::vector<Layout> out;
    for (std::size_t i : item.masks) {
      if (heads[i].empty()) throw Error(load_errors[i]);
      out.insert(out.end(), heads[i].begin(), heads[i].end());
    }
    return out;
  }
};

}  // namespace

std::vector<bool> tf32_settings(const KernelGroup& group, DType dt) {
  return dt == DType::f32 ? group.tf32 : std::vector<bool>{false};
}

namespace {

Expanded expand(const Manifest& m) {
  Expanded e;
  for (const auto& g : m.groups)
    for (const auto& file : g.layouts) {
      const std::size_t index = e.file_index(file);
      for (Op op : g.ops)
        for (int b : g.blocks)
          for (DType dt : g.dtypes)
            for (FeatureAxis ax : g.feature_axes)
              for (const auto& arch : g.archs)
                for (bool tf32 : tf32_settings(g, dt))
                  e.items.push_back(
                      {index, op, MatMulOptions{b, dt, ax, arch, tf32, g.sms}, g.calls,
                       fmt::format("{} {} {}{} b{} {} {}{}{}", file.filename().string(), to_string(op), to_string(dt),
                                   tf32 ? " tf32" : "", b, to_string(ax), arch,
                                   g.sms > 0 ? fmt::format(" ({} SMs)", g.sms) : "",
                                   g.calls == Calls::all ? "" : fmt::format(" ({} calls)", to_string(g.calls)))});
    }
  for (const auto& g : m.attention)
    for (const auto& files : g.masks) {
      AttentionItem base;
      std::string names;
      for (const auto& f : files) {
        base.masks.push_back(e.file_index(f));
        names += (names.empty() ? "" : "+") + f.filename().string();
      }
      for (const auto& op : g.ops)
        for (int b : g.blocks)
          for (int d : g.head_dims)
            for (DType dt : g.dtypes)
              for (QkvOrder order : g.orders)
                for (bool causal : g.causal)
                  for (int group : g.kv_groups)
                    for (const auto& arch : g.archs) {
                      AttentionItem item = base;
                      item.options = {b, d, dt, order, causal, arch, group};
                      item.decomposed = op == "decomposed";
                      item.what = fmt::format("{} attention {} {} b{} d{} {}{}{} {}", names, op, to_string(dt), b, d,
                                              to_string(order), causal ? " causal" : "",
                                              group > 1 ? fmt::format(" kv_group {}", group) : "", arch);
                      e.attention.push_back(std::move(item));
                    }
    }
  for (const auto& g : m.conv)
    for (const auto& file : g.layouts) {
      ConvItem base;
      try {
        if (g.block == 0 && file.extension() != ".json")
          throw Error(fmt::format("'{}': a block mask needs the conv group's \"block\"", file.string()));
        base.layout = std::make_shared<ConvLayout>(ConvLayout::load(file, g.block));
      } catch (const Error& err) {
        base.load_error = err.what();
      }
      for (const auto& filter : g.filters)
        for (DType dt : g.dtypes)
          for (ActivationOrder order : g.orders)
            for (const auto& arch : g.archs) {
              ConvItem item = base;
              item.filter = filter;
              item.options = {dt, order, false, arch};
              item.what = fmt::format("{} conv {}x{}x{} {} {} {}", file.filename().string(), filter[0], filter[1],
                                      filter[2], to_string(dt), to_string(order), arch);
              e.conv.push_back(std::move(item));
            }
    }
  return e;
}

// r's kernels built since before (cache_stats() when the call began).
void count_builds(DeployReport& r, const CacheStats& before) {
  const CacheStats now = cache_stats();
  r.nvrtc_runs = now.compiles - before.compiles;
  r.shared_code = now.shared_compiles - before.shared_compiles;
}

void count(DeployReport& r, const KernelOutcome& k) {
  switch (k.status) {
    case KernelOutcome::Status::compiled: ++r.compiled; break;
    case KernelOutcome::Status::cached: ++r.cached; break;
    case KernelOutcome::Status::loaded: ++r.loaded; break;
    case KernelOutcome::Status::failed: ++r.failed; break;
  }
  r.kernels.push_back(k);
}

// Whether a cubin built for kernel_arch loads on a device of device_arch ("sm_90"): same major;
// an "a" target only on exactly its own major.minor, a plain one on that minor or a later one.
bool runs_on(const std::string& kernel_arch, const std::string& device_arch) {
  static const std::regex re("sm_([0-9]{1,3})([0-9])(a|f)?");  // (no number that overflows stoi)
  std::smatch k, d;
  if (!std::regex_match(kernel_arch, k, re) || !std::regex_match(device_arch, d, re)) return false;
  if (k[1] != d[1]) return false;
  return k[3].matched ? k[2] == d[2] : std::stoi(k[2]) <= std::stoi(d[2]);
}

struct Device {
  int ordinal;
  runtime::Context ctx;
  std::string arch;
};

std::vector<Device> visible_devices() {
  std::string why;
  if (!runtime::gpu_available(&why)) throw Error("bsjit: warm-up needs a GPU: " + why);
  const auto& d = runtime::driver();
  int count = 0;
  BSJIT_CU(d.cuDeviceGetCount(&count));
  std::vector<Device> out;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    CUcontext ctx;
    BSJIT_CU(d.cuDeviceGet(&dev, i));
    BSJIT_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
    const runtime::Context c = runtime::context_of(ctx);
    out.push_back({i, c, runtime::context_arch(c)});
  }
  return out;
}

}  // namespace

Manifest Manifest::load(const fs::path& json_file) {
  nlohmann::json j;
  {
    std::ifstream in(json_file);
    if (!in) throw Error(fmt::format("cannot open manifest '{}'", json_file.string()));
    j = nlohmann::json::parse(in, nullptr, false);
  }
  if (j.is_discarded() || !j.is_object())
    throw Error(fmt::format("manifest '{}' is not a JSON object", json_file.string()));
  const fs::path base = json_file.parent_path();
  Manifest m;
  std::vector<nlohmann::json> groups;
  if (j.contains("kernels")) {
    if (!j["kernels"].is_array()) throw Error(fmt::format("manifest '{}': 'kernels' must be a list", json_file.string()));
    for (const auto& g : j["kernels"]) groups.push_back(g);
  } else if ((!j.contains("attention") && !j.contains("conv")) || j.contains("layouts")) {
    groups.push_back(j);
  }
  auto path = [&](const nlohmann::json& v) {
    fs::path p = v.get<std::string>();
    return p.is_absolute() ? p : base / p;
  };
  auto dtype = [](const nlohmann::json& v) { return parse_dtype(v.get<std::string>()); };
  auto integer = [&](const char* key) {  // an entry of the list `key`: an integer, nothing converted
    return [&, key](const nlohmann::json& v) {
      return static_cast<int>(
          json_integer(v, 0, INT32_MAX, fmt::format("manifest '{}': '{}'", json_file.string(), key)));
    };
  };
  auto text = [](const nlohmann::json& v) { return v.get<std::string>(); };
  try {
    for (const auto& g : groups) {
      KernelGroup k;
      if (!g.is_object() || !g.contains("layouts"))
        throw Error(fmt::format("manifest '{}': every group needs a 'layouts' list", json_file.string()));
      k.layouts = list_of<fs::path>(g, "layouts", {}, path);
      k.ops = list_of<Op>(g, "ops", k.ops, [](const nlohmann::json& v) { return parse_op(v.get<std::string>()); });
      k.blocks = list_of<int>(g, "blocks", k.blocks, integer("blocks"));
      k.dtypes = list_of<DType>(g, "dtypes", k.dtypes, dtype);
      k.feature_axes = list_of<FeatureAxis>(g, "feature_axes", k.feature_axes,
                                            [](const nlohmann::json& v) { return parse_feature_axis(v.get<std::string>()); });
      k.archs = list_of<std::string>(g, "archs", k.archs, text);
      k.tf32 = list_of<bool>(g, "tf32", k.tf32, [](const nlohmann::json& v) { return v.get<bool>(); });
      if (g.contains("sms"))
        k.sms = static_cast<int>(
            json_integer(g.at("sms"), 1, generator::kMaxSms, fmt::format("manifest '{}': 'sms'", json_file.string())));
      if (g.contains("calls")) {
        if (!g.at("calls").is_string())
          throw Error(
              fmt::format("manifest '{}': 'calls' must be \"all\", \"plain\" or \"with_options\"", json_file.string()));
        k.calls = parse_calls(g.at("calls").get<std::string>());
      }
      m.groups.push_back(std::move(k));
    }
    if (j.contains("attention")) {
      if (!j["attention"].is_array())
        throw Error(fmt::format("manifest '{}': 'attention' must be a list of groups", json_file.string()));
      for (const auto& g : j["attention"]) {
        AttentionGroup a;
        if (!g.is_object() || !g.contains("masks"))
          throw Error(fmt::format("manifest '{}': every attention group needs a 'masks' list", json_file.string()));
        a.masks = list_of<std::vector<fs::path>>(g, "masks", {}, [&](const nlohmann::json& v) {
          std::vector<fs::path> files;
          if (v.is_array())
            for (const auto& f : v) files.push_back(path(f));
          else
            files.push_back(path(v));
          if (files.empty()) throw Error(fmt::format("manifest '{}': an empty list of masks", json_file.string()));
          return files;
        });
        a.blocks = list_of<int>(g, "blocks", a.blocks, integer("blocks"));
        a.head_dims = list_of<int>(g, "head_dims", a.head_dims, integer("head_dims"));
        a.dtypes = list_of<DType>(g, "dtypes", a.dtypes, dtype);
        a.orders = list_of<QkvOrder>(g, "orders", a.orders,
                                     [](const nlohmann::json& v) { return parse_qkv_order(v.get<std::string>()); });
        a.causal = list_of<bool>(g, "causal", a.causal, [](const nlohmann::json& v) { return v.get<bool>(); });
        a.kv_groups = list_of<int>(g, "kv_groups", a.kv_groups, integer("kv_groups"));
        a.ops = list_of<std::string>(g, "ops", a.ops, [&](const nlohmann::json& v) {
          auto op = v.get<std::string>();
          if (op != "fused" && op != "decomposed")
            throw Error(fmt::format("manifest '{}': attention op '{}'; expected fused or decomposed", json_file.string(),
                                    op));
          return op;
        });
        a.archs = list_of<std::string>(g, "archs", a.archs, text);
        m.attention.push_back(std::move(a));
      }
    }
    if (j.contains("conv")) {
      if (!j["conv"].is_array())
        throw Error(fmt::format("manifest '{}': 'conv' must be a list of groups", json_file.string()));
      for (const auto& g : j["conv"]) {
        ConvGroup c;
        if (!g.is_object() || !g.contains("layouts"))
          throw Error(fmt::format("manifest '{}': every conv group needs a 'layouts' list", json_file.string()));
        c.layouts = list_of<fs::path>(g, "layouts", {}, path);
        if (g.contains("block"))
          c.block = static_cast<int>(
              json_integer(g["block"], 1, 1024, fmt::format("manifest '{}': conv 'block'", json_file.string())));
        c.filters = list_of<std::array<int, 3>>(g, "filters", c.filters, [&](const nlohmann::json& v) {
          const std::string what = fmt::format("manifest '{}': a conv filter [T, R, S]", json_file.string());
          if (!v.is_array() || v.empty() || v.size() > 3) throw Error(what + " must list 1 to 3 sizes");
          std::array<int, 3> f{1, 1, 1};  // fewer dimensions: the last ones (W; H, W)
          for (std::size_t i = 0; i < v.size(); ++i)
            f[3 - v.size() + i] = static_cast<int>(json_integer(v[i], 1, 64, what));
          return f;
        });
        c.dtypes = list_of<DType>(g, "dtypes", c.dtypes, dtype);
        c.orders = list_of<ActivationOrder>(g, "orders", c.orders, [](const nlohmann::json& v) {
          return parse_activation_order(v.get<std::string>());
        });
        c.archs = list_of<std::string>(g, "archs", c.archs, text);
        m.conv.push_back(std::move(c));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("manifest '{}': {}", json_file.string(), e.what()));
  }
  return m;
}

std::size_t Manifest::kernel_count() const {
  std::size_t n = 0;
  for (const auto& g : groups)
    for (DType dt : g.dtypes)
      n += g.layouts.size() * g.ops.size() * g.blocks.size() * tf32_settings(g, dt).size() * g.feature_axes.size() *
           g.archs.size();
  for (const auto& a : attention)
    n += a.masks.size() * a.ops.size() * a.blocks.size() * a.head_dims.size() * a.dtypes.size() * a.orders.size() *
         a.causal.size() * a.kv_groups.size() * a.archs.size();
  for (const auto& c : conv)
    n += c.layouts.size() * c.filters.size() * c.dtypes.size() * c.orders.size() * c.archs.size();
  return n;
}

DeployReport precompile(const Manifest& manifest, const PrecompileOptions& options) {
  const auto start = Clock::now();
  const CacheStats before = cache_stats();
  auto& cache = cache::KernelCache::global();
  struct Recording {  // the entries this call writes are listed while it runs
    cache::KernelCache& cache;
    explicit Recording(cache::KernelCache& c) : cache(c) { cache.record_writes(true); }
    ~Recording() { cache.record_writes(false); }
  } recording(cache);
  const cache::KernelCache::DiskWrites writes_before = cache.disk_writes();
  Expanded e = expand(manifest);
  const std::size_t matmuls = e.items.size(), attentions = e.attention.size(),
                    total = matmuls + attentions + e.conv.size();
  std::vector<KernelOutcome> outcomes(total);
  std::atomic<std::size_t> done{0};
  std::mutex progress_mutex;
  runtime::parallel_for(total, options.threads > 0 ? static_cast<unsigned>(options.threads) : 0, [&](std::size_t i) {
    KernelOutcome& o = outcomes[i];
    auto t = Clock::now();
    try {
      bool now;
      if (i < matmuls) {
        const Item& item = e.items[i];
        o.what = item.what;
        if (!e.layouts[item.layout]) throw Error(e.load_errors[item.layout]);
        now = MatMul(*e.layouts[item.layout], item.options).precompile(item.op, item.options.arch, item.calls);
      } else if (i < matmuls + attentions) {
        const AttentionItem& item = e.attention[i - matmuls];
        o.what = item.what;
        now = item.decomposed ? AttentionOps(e.masks_of(item), item.options).precompile(item.options.arch) > 0
                              : Attention(e.masks_of(item), item.options).precompile(item.options.arch);
      } else {
        const ConvItem& item = e.conv[i - matmuls - attentions];
        o.what = item.what;
        now = item.conv().precompile(item.options.arch) > 0;
      }
      o.status = now ? KernelOutcome::Status::compiled : KernelOutcome::Status::cached;
    } catch (const Error& err) {
      o.error = err.what();
    }
    o.milliseconds = ms_since(t);
    std::size_t d = ++done;
    if (options.progress) {
      std::lock_guard lock(progress_mutex);
      options.progress(d, total);
    }
  });
  DeployReport r;
  for (const auto& o : outcomes) count(r, o);
  count_builds(r, before);
  // what this call built and the cache directory does not hold at its end
  const cache::KernelCache::DiskWrites writes = cache.disk_writes();
  const std::int64_t kept_in_memory = writes.not_written - writes_before.not_written;
  std::int64_t evicted = 0;
  for (std::size_t i = writes_before.written.size(); i < writes.written.size(); ++i) {
    std::error_code ec;
    evicted += !fs::exists(writes.written[i], ec);
  }
  r.not_on_disk = kept_in_memory + evicted;
  const fs::path directory = cache.config().directory;
  if (kept_in_memory > 0)
    r.disk_problem = directory.empty() ? "no cache directory (memory only)"
                                       : fmt::format("{} kernels could not be written to '{}' (see the warnings above)",
                                                     kept_in_memory, directory.string());
  if (evicted > 0)
    r.disk_problem += fmt::format("{}{} entries written by this call were evicted by the size bound ({} bytes)",
                                  r.disk_problem.empty() ? "" : "; ", evicted, cache.config().max_bytes);
  r.seconds = ms_since(start) / 1000;
  return r;
}

DeployReport warmup(const Manifest& manifest, bool strict) {
  const auto start = Clock::now();
  const CacheStats before = cache_stats();
  auto devices = visible_devices();
  Expanded e = expand(manifest);
  const auto on_miss = strict ? cache::OnMiss::fail : cache::KernelCache::global().run_time_on_miss();
  const auto& d = runtime::driver();
  DeployReport r;
  for (const auto& dev : devices) {
    BSJIT_CU(d.cuCtxSetCurrent(dev.ctx.handle));
    std::size_t matched = 0;
    // load(): the item's kernels into dev.ctx; one report line per item
    auto attempt = [&](const std::string& arch, const std::string& what, const std::function<void()>& load) {
      if (!runs_on(arch, dev.arch)) return;
      ++matched;
      KernelOutcome o;
      o.what = fmt::format("{} on GPU {}", what, dev.ordinal);
      auto t = Clock::now();
      try {
        load();
        o.status = KernelOutcome::Status::loaded;
      } catch (const Error& err) {
        o.error = err.what();
      }
      o.milliseconds = ms_since(t);
      count(r, o);
    };
    for (const Item& item : e.items)
      attempt(item.options.arch, item.what, [&] {
        if (!e.layouts[item.layout]) throw Error(e.load_errors[item.layout]);
        const Layout& layout = *e.layouts[item.layout];
        const std::string hash = layout.hash().hex();
        const auto specs = runtime::op_variants(item.op, item.options);
        for (int v = 0; v < static_cast<int>(specs.size()); ++v)
          for (bool plain : runtime::plain_kinds(item.calls)) {
            const auto spec = runtime::call_spec(hash, specs, v, plain, item.options.arch);
            const runtime::KernelId id{hash, spec, item.options.arch};
            auto p = runtime::KernelRegistry::global().prepare(layout, id, on_miss);
            runtime::KernelRegistry::global().pin(id, p, dev.ctx, on_miss);
          }
      });
    for (const AttentionItem& item : e.attention)
      attempt(item.options.arch, item.what, [&] {
        const bool fail_on_miss = on_miss == cache::OnMiss::fail;
        if (item.decomposed) AttentionOps(e.masks_of(item), item.options).load(fail_on_miss);
        else Attention(e.masks_of(item), item.options).load(fail_on_miss);
      });
    for (const ConvItem& item : e.conv)
      attempt(item.options.arch, item.what, [&] { item.conv().load(on_miss == cache::OnMiss::fail); });
    if (matched == 0 && !(e.items.empty() && e.attention.empty() && e.conv.empty())) {
      KernelOutcome o;
      o.what = fmt::format("GPU {} ({})", dev.ordinal, dev.arch);
      o.error = fmt::format("the manifest has no kernel for {}", dev.arch);
      count(r, o);
    }
  }
  count_builds(r, before);
  r.seconds = ms_since(start) / 1000;
  return r;
}

DeployReport warmup_directory(const fs::path& directory) {
  const auto start = Clock::now();
  auto devices = visible_devices();
  const auto& d = runtime::driver();
  DeployReport r;
  for (const auto& info : list_cache(directory)) {
    if (!info.valid) {
      KernelOutcome o;
      o.what = info.path.filename().string();
      o.error = info.problem;
      count(r, o);
      continue;
    }
    std::shared_ptr<runtime::CompiledKernel> kernel;
    for (const auto& dev : devices) {
      if (!runs_on(info.arch, dev.arch)) continue;
      KernelOutcome o;
      o.what = fmt::format("{} on GPU {}", info.path.filename().string(), dev.ordinal);
      auto t = Clock::now();
      try {
        if (!kernel) {
          std::ifstream in(info.path, std::ios::binary);
          std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          std::string why;
          cache::EntryHeader header;
          kernel = cache::KernelCache::deserialize(bytes, info.key, &why, &header);
          if (!kernel) throw Error(fmt::format("entry became unusable: {}", why));
          cache::KernelCache::global().insert(info.key, kernel, header.code_key);
        }
        BSJIT_CU(d.cuCtxSetCurrent(dev.ctx.handle));
        runtime::KernelRegistry::global().pin(kernel, dev.ctx);
        o.status = KernelOutcome::Status::loaded;
      } catch (const Error& err) {
        o.error = err.what();
      }
      o.milliseconds = ms_since(t);
      count(r, o);
    }
  }
  r.seconds = ms_since(start) / 1000;
  return r;
}

}  // namespace bsjit
