#include "attention_common.hpp"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "bsjit/error.hpp"
#include "compiler.hpp"
#include "module.hpp"

namespace bsjit::runtime {

std::string masks_hash(const std::vector<Layout>& masks) {
  std::string material;
  for (const auto& m : masks) material += m.hash().hex();
  const XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

float check_attention_call(const char* op, std::initializer_list<std::pair<const char*, const void*>> pointers,
                           std::int64_t batch, std::int64_t heads, const std::vector<Layout>& masks,
                           const AttentionOptions& options, float scale) {
  for (const auto& [name, ptr] : pointers) {
    if (ptr == nullptr) throw Error(fmt::format("bsjit: {}: {} is a null pointer", op, name));
    if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0)
      throw Error(fmt::format("bsjit: {}: {} ({}) is not 16-byte aligned", op, name, ptr));
  }
  const auto count = static_cast<std::int64_t>(masks.size());
  if (heads <= 0 || heads > 65535 || (count > 1 && heads != count))
    throw Error(
        fmt::format("bsjit: {}: heads = {} does not fit {} block mask(s) (1 ≤ heads ≤ 65535)", op, heads, count));
  if (batch <= 0 || batch > 65535) throw Error(fmt::format("bsjit: {}: batch = {} out of 1..65535", op, batch));
  if (heads % options.kv_group != 0)
    throw Error(fmt::format("bsjit: {}: heads = {} is not a multiple of kv_group = {} (query heads per key/value head)",
                            op, heads, options.kv_group));
  const std::int64_t seq = std::max(masks[0].rows(), masks[0].cols()) * options.block, d = options.head_dim;
  // (TMA coordinates of the Hopper kernels are 32-bit: batch · seq must fit)
  if (batch * heads * seq * std::max<std::int64_t>(d, seq) > INT64_MAX / 4 || batch * heads > INT32_MAX ||
      batch * seq > INT32_MAX)
    throw Error(fmt::format("bsjit: {}: batch {} × heads {} × sequence {} is too large", op, batch, heads, seq));
  return scale != 0 ? scale : 1.0f / std::sqrt(static_cast<float>(d));
}

std::string kernel_arch(const std::string& arch, const Context& ctx) {
  return arch.empty() ? default_kernel_arch(context_arch(ctx)) : arch;
}

int head_band(std::int64_t pairs, std::int64_t line_bytes, const generator::TileFootprint& footprint, std::int64_t wave,
              std::int64_t l2_bytes, int group) {
  pairs = std::max<std::int64_t>(1, pairs), wave = std::max<std::int64_t>(1, wave);
  const std::int64_t budget = std::max<std::int64_t>(0, l2_bytes / 2);
  // A band of w pairs runs ⌈wave / w⌉ tiles of each at once. The bands whose run is in (2^(i-1), 2^i]
  // all read footprint.of(2^i) lines a pair: the widest of them that fits, widest class first.
  std::int64_t band = 1;
  for (int i = 0; i < 62; ++i) {
    const std::int64_t run = std::int64_t{1} << i, lo = (wave + run - 1) / run;
    const std::int64_t hi = std::min(pairs, i == 0 ? pairs : (wave + run / 2 - 1) / (run / 2) - 1);
    const std::int64_t per_pair = line_bytes * footprint.of(run);
    const std::int64_t fits = per_pair > 0 ? budget / per_pair : pairs;
    if (std::min(hi, fits) >= lo) {
      band = std::min(hi, fits);
      break;
    }
    if (lo == 1) break;
  }
  if (band >= group) band -= band % group;
  return static_cast<int>(std::clamp<std::int64_t>(band, 1, pairs));
}

cache::Request named_kernel_request(const std::string& source, const generator::DeviceTables& tables,
                                    const std::string& name, const std::string& label, int shared_bytes,
                                    const std::string& arch, const std::string& layout_hash) {
  check_arch(arch);
  const std::string code = source + "\n// kernel: " + name;
  return {cache::make_key(cache::key_inputs(code, tables, arch)),
          label,
          arch,
          layout_hash,
          [source, name, label, arch, shared_bytes] {
            auto k = compile(source, name, label, arch);
            k.shared_bytes = shared_bytes;
            return k;
          },
          tables,
          cache::code_key(code, arch)};
}

SharedKernels::Handle load_cached(const cache::Request& request, const Context& ctx, cache::OnMiss on_miss) {
  auto kernel = cache::KernelCache::global().get(request, on_miss);
  return load_or_rebuild(&kernel, request, ctx, on_miss);
}

}  // namespace bsjit::runtime
