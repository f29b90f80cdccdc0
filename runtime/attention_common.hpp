// What bsjit::Attention and bsjit::AttentionOps share: the masks' hash (the layout tag of their
// cache entries) and the argument checks every call makes; and what they share with bsjit::Conv:
// kernels of a multi-kernel source compiled, cached and loaded one by one.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/attention.hpp"
#include "cache/kernel_cache.hpp"
#include "generator/attention_generator.hpp"
#include "module.hpp"

namespace bsjit::runtime {

std::string masks_hash(const std::vector<Layout>& masks);

// Before any GPU work: device pointers set and 16-byte aligned, heads fitting the masks, batch in
// range, sizes that fit 64-bit offsets. Returns the scale the kernels take (0: 1 / sqrt(head_dim)).
float check_attention_call(const char* op, std::initializer_list<std::pair<const char*, const void*>> pointers,
                           std::int64_t batch, std::int64_t heads, const std::vector<Layout>& masks,
                           const AttentionOptions& options, float scale);

// The arch kernels for ctx are compiled for: the options' arch where one is given, else the device's
// default (Attention, AttentionOps, Conv and ConvEdgeBias alike).
std::string kernel_arch(const std::string& arch, const Context& ctx);

// (batch, head) pairs per band of the fused kernels' grid (kernels::BandedTile in
// templates/bsjit/attention.cuh): as many as fit half of an L2 of l2_bytes the lines that a wave of
// `wave` CTAs reads, whole key/value groups of `group` pairs where one fits, at least 1 and at most
// `pairs`. A band of w pairs runs ⌈wave / w⌉ consecutive tiles of each at once, which read
// footprint.of(that many) lines of line_bytes a pair: with a causal mask every line from the first
// tile (a band then holds the pairs whose whole streamed tensors fit), with a window mask few, so
// that the band widens and a wave runs few tiles of each pair.
int head_band(std::int64_t pairs, std::int64_t line_bytes, const generator::TileFootprint& footprint, std::int64_t wave,
              std::int64_t l2_bytes, int group);

// The cache request for kernel `name` (a name expression) of source with its tables for arch: its
// key, code key and compile (which copies what it needs). layout_hash tags the entry.
cache::Request named_kernel_request(const std::string& source, const generator::DeviceTables& tables,
                                    const std::string& name, const std::string& label, int shared_bytes,
                                    const std::string& arch, const std::string& layout_hash);

// The request's kernel loaded into ctx: from the global cache (compiled on a miss unless on_miss
// says fail; layouts whose sources agree share the compile, cache::Request::code_key),
// loaded by load_or_rebuild (compiled again where the driver refuses the cached code).
SharedKernels::Handle load_cached(const cache::Request& request, const Context& ctx, cache::OnMiss on_miss);

}  // namespace bsjit::runtime
