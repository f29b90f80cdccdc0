// Turns (block masks, attention options) into the attention kernels' source, instantiating
// templates/bsjit/attention*.cuh. The masks' block lists are tables (device_tables.hpp): declared
// in the source, their values beside it in `tables`, copied in when the module is loaded. They
// are pointers and the block counts a table too (kDims), so the sources hold no sequence length:
// one source per configuration serves every mask and length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bsjit/attention.hpp"
#include "bsjit/layout.hpp"
#include "device_tables.hpp"

namespace bsjit::generator {

// What consecutive tiles of a fused kernel's launch order read of the other side (key blocks for
// the forward's query tiles, query blocks for the backward's key tiles): blocks[i], the distinct
// blocks that 2^i consecutive tiles touch in one mask, at 9 places of 10 along the order (the most
// over the masks). A causal mask's run touches nearly all; a window mask's run of t tiles about
// t · tile / block plus the window, its few global tiles aside. The runtime sizes the grid's bands
// of heads by it (runtime::head_band).
struct TileFootprint {
  std::vector<std::int64_t> blocks;
  std::int64_t tiles = 0, lines = 0;  // tiles in the order; blocks of the other side
  // Blocks that t consecutive tiles touch: blocks[⌈log2 t⌉], or all lines past the runs measured
  // (runs stop at every tile, at 7/8 of the lines, or at 4096 tiles).
  std::int64_t of(std::int64_t t) const;
};

// Block-64 masks on Hopper whose 128-tiles are mostly live run on the block-128 kernels: the mask of
// 128-tiles (a tile where any of its four 64-blocks is), and per tile of each mask, in the order of
// its coords(), its quadrants as 4 bits (bit 2i + j: the 64-block (2r + i, 2c + j)), the others
// masked in the kernels. Per live block of 64 the coarse kernels run 1.2× (head dim 128) and 1.1×
// (64) faster forward than the block-64 kernels (suite A's causal and window masks on an H100,
// 2026-12-07, docs/PERFORMANCE.md "Block-64 masks on tiles of 128"), and backward 1.6× and 1.29×:
// 1.35× and 1.01× measured there, times the ×1.19 and ×1.28 that dQ's bulk reduction gave the
// block-128 backward and not the block-64 one (section "dQ by bulk reduction"). A pass coarsens
// where its live share of the tiles' quadrants times that gain is over 1.05.
struct CoarseMasks {
  std::vector<Layout> masks;
  std::vector<std::vector<int>> quadrants;  // per mask, per coords() entry
  double live = 0;                          // 64-blocks over 4 · tiles, all masks
};
// The 128-tile masks of block-64 masks (their rows and columns even), whatever they gain.
CoarseMasks coarse_masks(const std::vector<Layout>& masks);
// Whether a pass (backward or forward) of these options for arch runs coarse, and on what.
std::optional<CoarseMasks> coarse_attention(const std::vector<Layout>& masks, const AttentionOptions& options,
                                            const std::string& arch, bool backward);

struct GeneratedAttention {
  std::string source, name_expression, label;
  int block = 0;  // the kernel's: options.block, or 128 where it runs coarse (CoarseMasks)
  int threads = 0, shared_bytes = 0;
  std::int64_t query_tiles = 0;  // grid y (heaviest first); x = batch · heads
  std::int64_t seq_q = 0, seq_k = 0;
  // The Hopper kernel (attention_hopper.cuh): arguments end with tensor maps of Q, K and V, boxes
  // of 64 head-dim columns × q_rows (Q) or kv_rows (K, V) positions.
  bool tma = false;
  int q_rows = 0, kv_rows = 0;
  TileFootprint footprint;  // of the query tiles' launch order, in key blocks
  DeviceTables tables;  // kRowStart, kKeys, kTileOrder (pointers); kDims (constant)
};

// The kernel for arch ("sm_90a": the wgmma/TMA kernel where the shape allows, block ≥ 64 and
// head_dim ≥ 64). Throws Error for masks of different shapes, or options the kernels do not take.
GeneratedAttention generate_attention_forward(const std::vector<Layout>& masks, const AttentionOptions& options,
                                              const std::string& arch);

// The backward: one source, three kernels run in order (templates/bsjit/attention_backward.cuh):
// prep (Delta, zeroes the dQ accumulator; grid batch · heads × query_rows16, 128 threads), main
// (grid batch · heads × key_tiles, `threads`, `shared_bytes`), dq (like prep). For arch "sm_90a"
// with block ≥ 64 and head_dim ≥ 64 the main kernel is the wgmma/TMA one
// (attention_backward_hopper.cuh): its arguments end with tensor maps of Q, K, V and dO, boxes of
// 64 head-dim columns × q_rows (Q, dO) or kv_rows (K, V) positions.
// With options.kv_group > 1 a fourth, dkv, runs last: dK and dV from the fp32 accumulators the main
// kernel adds each query head's gradients to (grid batch · heads / kv_group × key_rows16, 128
// threads).
struct GeneratedAttentionBackward {
  std::string source, label, prep, main, dq, dkv;  // name expressions; dkv empty without a group
  int block = 0;  // as GeneratedAttention::block
  int threads = 0, shared_bytes = 0;
  std::int64_t key_tiles = 0, query_rows16 = 0, key_rows16 = 0;
  bool tma = false;
  int q_rows = 0, kv_rows = 0;
  TileFootprint footprint;  // of the main kernel's key tiles' launch order, in query blocks
  DeviceTables tables;  // kColStart, kQueryBlocks, kKeyTileOrder (pointers); kDims (constant)
};
GeneratedAttentionBackward generate_attention_backward(const std::vector<Layout>& masks,
                                                       const AttentionOptions& options, const std::string& arch);

// The decomposed ops (templates/bsjit/attention_ops.cuh): one source, five kernels, each grid's x
// being batch · heads (probs_t's: batch · heads / kv_group). Products in tiles of `tile` rows (threads = 2 · tile);
// softmax kernels 128 threads, a warp per query row.
struct GeneratedAttentionOps {
  std::string source, label, scores, softmax, softmax_grad, probs_v, probs_t;  // name expressions
  int tile = 0, threads = 0, scores_shared = 0, product_shared = 0;
  std::int64_t score_tiles = 0;  // scores' grid y: the most blocks of a mask × (block / tile)²
  std::int64_t query_tiles = 0, key_tiles = 0, softmax_rows4 = 0;  // grid y of probs_v, probs_t, softmax
  std::int64_t mask_blocks = 0;  // nonzero blocks of all masks together (positions of the tables)
  std::vector<std::int64_t> blocks_per_mask;
  DeviceTables tables;  // by row: kRowStart, kKeys, kBlockRows; by column: kColStart, kQueryBlocks,
                        // kColPositions; launch orders kTileOrder, kKeyTileOrder (pointers); kDims
};
GeneratedAttentionOps generate_attention_ops(const std::vector<Layout>& masks, const AttentionOptions& options);

}  // namespace bsjit::generator
