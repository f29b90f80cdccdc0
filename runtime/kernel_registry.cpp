#include "kernel_registry.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>

#include "bsjit/error.hpp"
#include "driver.hpp"
#include "generator/json_fields.hpp"
#include "generator/templates.hpp"
#include "module.hpp"
#include "parallel.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::runtime {

cache::Request cache_request(const generator::GeneratedSource& g, const std::string& key, const std::string& arch,
                             const std::string& layout_hash) {
  // g is captured by reference: the request lives no longer than the call it is made for
  return {key,
          g.label,
          arch,
          layout_hash,
          [&g, arch] {
            auto k = compile(g.source, g.name_expression, g.label, arch);
            k.shared_bytes = g.shared_bytes;
            return k;
          },
          g.tables,
          cache::code_key(g.source, arch)};
}

std::shared_ptr<const PreparedKernel> KernelRegistry::prepare(const Layout& layout, const KernelId& id,
                                                              cache::OnMiss on_miss, bool* compiled_now) {
  if (compiled_now) *compiled_now = false;
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard lock(mutex_);
    if (prepared_.size() >= sweep_at_) {
      // forget the ids nobody holds: a slot only the map holds is touched by no other thread
      std::erase_if(prepared_, [](const auto& e) { return e.second.use_count() == 1 && e.second->prepared.expired(); });
      sweep_at_ = std::max<std::size_t>(64, 2 * prepared_.size());
    }
    auto& s = prepared_[id];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  std::lock_guard slot_lock(slot->mutex);  // one id prepares once; other ids go on in parallel
  if (auto held = slot->prepared.lock()) return held;
  check_arch(id.arch);
  auto p = std::make_shared<PreparedKernel>();
  p->generated = generator::generate_matmul(layout, id.spec);
  p->key = cache::make_key(cache::key_inputs(p->generated.source, p->generated.tables, id.arch));
  cache::Request request = cache_request(p->generated, p->key, id.arch, id.layout_hash);
  if (!id.spec.plain)  // what a plain-only manifest leaves out
    request.miss_hint =
        " (the kernel of calls with OpOptions, accumulate or gate: precompile with calls \"all\" or "
        "\"with_options\", not \"plain\")";
  p->compiled = cache::KernelCache::global().get(request, on_miss, compiled_now);
  slot->prepared = p;
  return p;
}

SharedKernels::Handle KernelRegistry::load(const KernelId& id, std::shared_ptr<const PreparedKernel>* prepared,
                                           const Context& ctx, cache::OnMiss on_miss) {
  const PreparedKernel& p = **prepared;
  cache::KernelCache::Compiled kernel = p.compiled;
  auto loaded = load_or_rebuild(&kernel, cache_request(p.generated, p.key, id.arch, id.layout_hash), ctx, on_miss);
  if (kernel != p.compiled) {
    auto rebuilt = std::make_shared<PreparedKernel>(p);
    rebuilt->compiled = kernel;
    *prepared = rebuilt;
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard lock(mutex_);
      if (auto it = prepared_.find(id); it != prepared_.end()) slot = it->second;
    }
    if (slot) {
      std::lock_guard slot_lock(slot->mutex);
      slot->prepared = rebuilt;
    }
  }
  return loaded;
}

std::vector<std::shared_ptr<const PreparedKernel>> KernelRegistry::prepare_all(
    const std::vector<std::pair<const Layout*, KernelId>>& kernels, cache::OnMiss on_miss,
    std::vector<char>* compiled_now) {
  std::vector<std::shared_ptr<const PreparedKernel>> prepared(kernels.size());
  std::vector<std::string> errors(kernels.size());
  if (compiled_now) compiled_now->assign(kernels.size(), 0);
  parallel_for(kernels.size(), 0, [&](std::size_t i) {
    try {
      bool now = false;
      prepared[i] = prepare(*kernels[i].first, kernels[i].second, on_miss, &now);
      if (compiled_now) (*compiled_now)[i] = now ? 1 : 0;
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  return prepared;
}

std::vector<generator::MatMulSpec> op_variants(Op op, const MatMulOptions& options) {
  generator::MatMulSpec spec{op, options.block, options.dtype, options.feature_axis};
  spec.tf32 = options.tf32;
  if (options.sms > 0) spec.sms = options.sms;
  return generator::variants(spec);
}

generator::MatMulSpec call_spec(const std::string& layout_hash, const std::vector<generator::MatMulSpec>& variants,
                                int v, bool plain, const std::string& arch, int sms) {
  generator::MatMulSpec spec = variants[v];
  spec.plain = plain;
  if (sms > 0) spec.sms = sms;
  return resolve_spec(layout_hash, spec, arch, v);
}

std::vector<bool> plain_kinds(Calls calls) {
  if (calls == Calls::all) return {true, false};
  return {calls == Calls::plain};
}

std::string tuning_key(const std::string& layout_hash, const generator::MatMulSpec& spec, const std::string& arch,
                       int variant) {
  // Templates and format version in the key: a record from another bsjit is never applied. Not
  // spec.plain: an op's plain and general kernels share one record.
  std::string material =
      fmt::format("bsjit-tuning {} {} {} {} {} {}{} {} {} {}", cache::kFormatVersion, generator::templates_hash(),
                  layout_hash, to_string(spec.op), spec.block, to_string(spec.dtype), spec.tf32 ? "-tf32" : "",
                  to_string(spec.feature_axis), arch, variant);
  XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

namespace {
std::string tuning_stem(const generator::MatMulSpec& spec, const std::string& arch, int variant) {
  return fmt::format("{}-{}{}-b{}-{}-{}-{}", to_string(spec.op), to_string(spec.dtype), spec.tf32 ? "-tf32" : "",
                     spec.block, to_string(spec.feature_axis), arch, variant == 0 ? "any-n" : "small-n");
}
}  // namespace

generator::MatMulSpec resolve_spec(const std::string& layout_hash, generator::MatMulSpec spec, const std::string& arch,
                                   int variant) {
  spec.wgmma = generator::has_wgmma(arch) && !spec.tf32;  // TF32 runs the mma.sync kernels
  if (!spec.wgmma) spec.sms = generator::kDefaultSms;     // only the Hopper schedules read it
  const std::string record = cache::KernelCache::global().find_tuning(tuning_key(layout_hash, spec, arch, variant),
                                                                      tuning_stem(spec, arch, variant));
  if (record.empty()) return spec;
  try {
    auto j = nlohmann::json::parse(record).at("tiles");
    generator::TileConfig t;
    t.bm = static_cast<int>(json_integer(j.at("bm"), 0, 4096, "tuning record: bm"));
    t.bk = static_cast<int>(json_integer(j.at("bk"), 0, 4096, "tuning record: bk"));
    t.warps_m = static_cast<int>(json_integer(j.at("warps_m"), 0, 4096, "tuning record: warps_m"));
    t.warps_n = static_cast<int>(json_integer(j.at("warps_n"), 0, 4096, "tuning record: warps_n"));
    t.stages = static_cast<int>(json_integer(j.at("stages"), 0, 4096, "tuning record: stages"));
    t.group = static_cast<int>(json_integer(j.at("group"), 0, 4096, "tuning record: group"));
    t.wgmma = j.value("wgmma", false);
    t.tma = j.value("tma", false);
    t.persistent = j.value("persistent", false);
    t.columns = j.value("columns", 0);
    t.tile_edge = j.value("tile_edge", 0);
    t.tile_cols = j.value("tile_cols", 0);
    t.row_blocks = j.value("row_blocks", 0);
    t.band_rows = j.value("band_rows", 0);
    t.swapped = j.value("swapped", false);
    t.paired = j.value("paired", false);
    t.staged = j.value("staged", false);
    t.split = j.value("split", false);
    generator::MatMulSpec tuned = spec;
    tuned.tiles = t;
    generator::choose_tiles(tuned);  // throws when the shape does not fit this spec
    return tuned;
  } catch (const std::exception& e) {
    spdlog::warn("bsjit: tuning record for {} is unusable ({}); using the default tile shape",
                 tuning_stem(spec, arch, variant), e.what());
    return spec;
  }
}

void store_tuning(const std::string& layout_hash, const generator::MatMulSpec& spec, const std::string& arch, int variant,
                  const generator::TileConfig& t) {
  const std::string key = tuning_key(layout_hash, spec, arch, variant);
  nlohmann::json j;
  j["key"] = key;
  j["layout_hash"] = layout_hash;
  auto& o = j["tiles"];
  o["bm"] = t.bm, o["bk"] = t.bk, o["warps_m"] = t.warps_m, o["warps_n"] = t.warps_n, o["stages"] = t.stages,
  o["group"] = t.group, o["wgmma"] = t.wgmma, o["tma"] = t.tma, o["persistent"] = t.persistent,
  o["columns"] = t.columns, o["tile_edge"] = t.tile_edge, o["tile_cols"] = t.tile_cols, o["row_blocks"] = t.row_blocks,
  o["band_rows"] = t.band_rows, o["swapped"] = t.swapped, o["paired"] = t.paired, o["staged"] = t.staged, o["split"] = t.split,
  o["tag"] = generator::tiles_tag(t);
  cache::KernelCache::global().store_tuning(key, tuning_stem(spec, arch, variant), j.dump());
}

LaunchShape launch_shape(const PreparedKernel& kernel, Op op, std::int64_t n) {
  constexpr std::int64_t kMaxGridY = 65535;
  const auto& g = kernel.generated;
  LaunchShape shape;
  shape.threads = static_cast<std::uint32_t>(g.tiles.threads);
  shape.shared_bytes = static_cast<std::uint32_t>(g.shared_bytes);
  shape.grid_x = static_cast<std::uint32_t>(g.grid_x);
  shape.grid_y = static_cast<std::uint32_t>(g.splits);
  if (g.rows_per_cta > 0) {
    const std::int64_t gy = (n + g.rows_per_cta - 1) / g.rows_per_cta;
    if (gy > kMaxGridY)
      throw Error(fmt::format("bsjit: {}: n = {} needs {} row tiles; at most {} are supported (n ≤ {})", to_string(op),
                              n, gy, kMaxGridY, kMaxGridY * g.rows_per_cta));
    shape.grid_y = static_cast<std::uint32_t>(gy);
  }
  return shape;
}

LaunchShape launch_shape(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op,
                         std::int64_t n) {
  const auto& g = kernel.generated;
  LaunchShape shape;
  if (g.persistent) {
    shape.threads = static_cast<std::uint32_t>(g.tiles.threads);
    shape.shared_bytes = static_cast<std::uint32_t>(g.shared_bytes);
    shape.grid_y = 1;
    if (g.split) {
      // the small batch's split columns: the CTAs the generator dealt the blocks to, whatever the GPU
      if (n > g.max_rows)
        throw Error(fmt::format("bsjit: {}: n = {} is over the {} rows the small-batch kernel {} is built for",
                                to_string(op), n, g.max_rows, g.label));
      shape.grid_x = static_cast<std::uint32_t>(g.grid_x);
    } else if (g.rows_per_cta == 0) {
      // backward-weight: every CTA the GPU holds, over grid_x units of dW (SddSchedule splits the
      // units left from the last full wave among the CTAs that would idle)
      shape.grid_x = g.grid_x > 0 ? static_cast<std::uint32_t>(resident_ctas(function, ctx, shape)) : 0;
    } else {
      // output tiles: row tiles of each output block column
      const std::int64_t tiles = g.grid_x * ((n + g.rows_per_cta - 1) / g.rows_per_cta);
      if (tiles > INT_MAX)
        throw Error(fmt::format("bsjit: {}: n = {} gives {} output tiles; at most {} are supported", to_string(op),
                                n, tiles, INT_MAX));
      shape.grid_x = static_cast<std::uint32_t>(std::min(tiles, resident_ctas(function, ctx, shape)));
    }
  } else {
    shape = launch_shape(kernel, op, n);
  }
  return shape;
}

std::size_t workspace_bytes(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op,
                            std::int64_t n) {
  const auto& g = kernel.generated;
  const auto bytes = static_cast<std::size_t>(g.workspace_bytes);
  if (!g.paced || bytes > sizeof(unsigned) * kernels::kSplitCounters) return bytes;  // partials too
  const std::int64_t rounds = generator::paced_rounds(g, launch_shape(kernel, function, ctx, op, n).grid_x, n);
  return rounds > kernels::kWaveGateLead ? bytes : 0;
}

void launch_prepared(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op, std::int64_t n,
                     CUstream stream, KernelArgs& args) {
  const auto& g = kernel.generated;
  const LaunchShape shape = launch_shape(kernel, function, ctx, op, n);
  if (shape.grid_x == 0) return;  // no output blocks (backward-weight of an empty layout)
  for (std::size_t i = 0; i < g.tensor_maps.size() && i < 3; ++i) {
    const auto& m = g.tensor_maps[i];
    const void* base = i == 0 ? args.a : i == 1 ? args.b : args.out;
    args.maps[i] = tensor_map_2d(g.dtype, base, m.inner, m.outer > 0 ? m.outer : n, m.box_inner, m.box_outer, m.swizzle);
  }
  launch(function, shape, stream, args);
}

CUfunction KernelRegistry::pin(const cache::KernelCache::Compiled& kernel, const Context& ctx,
                               std::shared_ptr<const PreparedKernel> prepared) {
  SharedKernels::Handle loaded = SharedKernels::global().acquire(kernel, ctx);
  std::lock_guard lock(mutex_);
  Pinned& p = pinned_[{kernel.get(), ctx}];
  if (!p.loaded) p.loaded = std::move(loaded);
  if (!p.prepared) p.prepared = std::move(prepared);
  return p.loaded->function;
}

CUfunction KernelRegistry::pin(const KernelId& id, std::shared_ptr<const PreparedKernel> prepared, const Context& ctx,
                               cache::OnMiss on_miss) {
  const SharedKernels::Handle loaded = load(id, &prepared, ctx, on_miss);  // held: pin finds it loaded
  return pin(prepared->compiled, ctx, prepared);
}

std::size_t KernelRegistry::slots() {
  std::lock_guard lock(mutex_);
  return prepared_.size();
}

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry registry;
  return registry;
}

}  // namespace bsjit::runtime
