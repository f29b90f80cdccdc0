// dsd_grouped_kernel: forward Y = X·W and backward-data dX = dY·Wᵀ on Hopper (sm_90a) for blocks
// of 16 and 32, where one output block column is too narrow to feed the tensor cores
// (docs/PERFORMANCE.md, "What bounds the open cells").
//
// The product is computed transposed, Yᵀ = Wᵀ·Xᵀ, so that the narrow side is wgmma's M, which is 64
// whatever the width: a consumer warpgroup owns 64 / b output block columns of the CTA's group and
// stacks their W blocks for one input block into one 64-row A operand; the X tile of BM rows is the
// B operand, N = BM (up to 256), as wide as dense GEMM's wgmmas.
//
// A step of the CTA is one chunk of 64 reduction indices (64 / b input blocks) holding a block of
// the group: a TMA copy of the X tile (BM rows × 64 indices, 128-byte rows) and of every W block of
// the group in the chunk, into fixed slots (sub-block j, column c). TMA moves a box row by row, a few
// cycles a row whatever its width up to 128 bytes, so rows of one input block (2·b bytes) kept the
// copies, not the tensor cores, the limit (docs/PERFORMANCE.md). A consumer with a block in the step
// issues its wgmmas over the whole chunk (64 / b sub-blocks × b / 16 k16 slices); slots without a
// block hold zeros (written by a producer warp), so the tensor cores do some work on zeros in
// exchange for wide wgmmas and one X tile feeding every column of the group.
//
// Warp-specialized and persistent as dsd_tma_kernel: warpgroup 0 produces (warp 0 copies X, warps 1
// and 3 the W blocks, warp 2 zeros the absent slots), kWarpsM consumer warpgroups compute; stages
// complete on "full" mbarriers and are released on "empty" ones; a wave of CTAs loops over (group,
// row tile) tiles, group fastest so that CTAs running together share rows of X in L2. X is swizzled
// over 128-byte rows, W blocks over one block row (2·b bytes). The accumulators (Yᵀ) leave through
// a shared-memory tile per consumer, transposed by stmatrix, then in 16-byte stores along Y's rows.
//
// Tables (generated): group g's steps are kGroupSteps[3g] .. kGroupSteps[3g + 3] - 1, in three
// classes starting at kGroupSteps[3g + k]: chunks holding blocks of both consumers' columns, of
// consumer 0's only, of consumer 1's only; chunks ascending within a class. Step s is the record
// kSteps[s · (2 + 64 / b · kColumns) ...]: chunk, pattern (bit j · kColumns + c: sub-block j of column
// c holds a block), then the W block index of each slot (0 where absent). kGroupColumns[g · kColumns
// + c] is the output block column of column c (-1 past the last column).
#pragma once

#include "bsjit/matmul_hopper.cuh"

namespace bsjit {
namespace kernels {

template <class Cfg>
struct DsdGroupedPlan {
  static constexpr int S = Cfg::kStages;
  static constexpr int kRowBytes = 2 * Cfg::kBlock;   // a W block row: b 16-bit values
  static constexpr int kSlots = 64 / Cfg::kBlock;     // W blocks stacked into one consumer's A operand
  static constexpr int kSub = 64 / Cfg::kBlock;       // input blocks in a chunk of 64 reduction indices
  static constexpr int kXBytes = Cfg::kBM * 128;      // X tile: BM rows × 64 indices
  static constexpr int kSlotBytes = Cfg::kBlock * kRowBytes;
  static constexpr int kSlotCount = kSub * Cfg::kColumns;  // W slots of a step (at most 32)
  static constexpr int kStageBytes = kXBytes + kSlotCount * kSlotBytes;
  static constexpr int kRecord = 2 + kSlotCount;  // ints per step in kSteps
  // what a stage tells its consumers of its step: the pattern of present slots, then the sub-blocks
  // each consumer computes (byte h: bit j where sub-block j holds one of consumer h's blocks), both
  // written by one producer thread before its arrive (the W blocks' indices, needed only by a gate,
  // the consumers read from kSteps)
  static constexpr int kStageRecord = 2;
  // after the stages: their full and empty mbarriers and step records, then one output tile of up to
  // 128 rows × 64 values (128 bytes) per consumer, 128-byte aligned
  static constexpr int kRingBytes = (S * kStageBytes + 2 * S * 8 + S * kStageRecord * 4 + 127) / 128 * 128;
  static constexpr int kOutRows = Cfg::kBM < 128 ? Cfg::kBM : 128;
  static constexpr int kOutTileBytes = kOutRows * 128;
  static constexpr int kSharedBytes = kSwizzleAtomBytes + kRingBytes + Cfg::kWarpsM * kOutTileBytes;
};

// Scales one consumer's blocks of a stage by their gates (a block gated to 0 is zeroed, so that it
// adds nothing even where W holds infinities). mine: bit j · kSlots + c set where slot (sub-block j,
// column c) holds a block; slot(j, c) its address, block(j, c) its W block index. The consumer's 128
// threads call it with the same arguments.
template <class Cfg, class Slot, class Block>
__device__ __forceinline__ void gate_slots(unsigned mine, const float* gate, Slot slot, Block block, int consumer) {
  using Plan = DsdGroupedPlan<Cfg>;
  bool scaled = false;
#pragma unroll 1
  for (unsigned rest = mine; rest != 0; rest &= rest - 1) {
    const int i = __ffs(rest) - 1;
    const float g = gate[block(i / Plan::kSlots, i % Plan::kSlots)];
    if (g == 1.0f) continue;
    unsigned* words = reinterpret_cast<unsigned*>(slot(i / Plan::kSlots, i % Plan::kSlots));
#pragma unroll 1
    for (int k = threadIdx.x % 128; k < Plan::kSlotBytes / 4; k += 128)
      words[k] = g == 0.0f ? 0u : scale_pair<typename Cfg::T>(words[k], g);
    scaled = true;
  }
  if (scaled) {
    fence_proxy_async();  // the writes, for the wgmmas that read them
    named_barrier_sync(1 + consumer, 128);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dsd_grouped_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                       typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
                       float* __restrict__ workspace, const __grid_constant__ TensorMap map_a,
                       const __grid_constant__ TensorMap map_w) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = DsdGroupedPlan<Cfg>;
  constexpr int b = Cfg::kBlock, G = Cfg::kColumns, S = Cfg::kStages, BM = Cfg::kBM, P = Plan::kSlots;
  constexpr int kSub = Plan::kSub, kRowBytes = Plan::kRowBytes, kRecord = Plan::kRecord;
  constexpr int kSlotCount = Plan::kSlotCount, kConsumers = Cfg::kWarpsM, kClasses = 3;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && (b == 16 || b == 32), "16-bit, feature axis last, b = 16 or 32");
  static_assert(G == kConsumers * P && (kConsumers == 1 || kConsumers == 2), "each consumer owns 64 / b columns");
  static_assert(BM == 64 || BM == 128 || BM == 256, "the X tile is wgmma's N: 64, 128 or 256 rows");
  static_assert(Cfg::kThreads == (kConsumers + 1) * 128, "one producer warpgroup and the consumers");
  static_assert(S >= 2 && S <= 32 && kSlotCount <= 32, "patterns: one bit per slot and per stage");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);
  int* records = reinterpret_cast<int*>(ring.empty + S);  // the step record of each stage
  unsigned char* out_tiles = ring.base + Plan::kRingBytes;
  // Shared-memory addresses, computed once: stage s at stages_s + s · kStageBytes (its X tile, then
  // slot (j, c) at kXBytes + (j · G + c) · kSlotBytes), its barriers at full_s / empty_s + 8 s.
  const unsigned stages_s = smem_address(ring.base), full_s = smem_address(ring.full),
                 empty_s = smem_address(ring.empty);
  // stage s's W slots as a pointer, for the stores of zeros and gates
  auto slots_of = [&](int stage) { return ring.base + stage * Plan::kStageBytes + Plan::kXBytes; };

  const int warpgroup = threadIdx.x / 128;
  const int groups = Cfg::groups();  // of the layout: a table (b > 16), so one source serves its shape
  const int tiles = groups * ((n + BM - 1) / BM);
  // Over 16 W slots a step (b = 16), warps 1 and 3 copy half each: a warp issues its lanes' copies
  // one after another. Measured (suite W against one copying warp): b = 16 d = 0.5 322 -> 372 TFLOP/s,
  // d = 0.25 201 -> 213, d <= 0.1 +2-3%; split at b = 32 too (8 slots, 4 a warp): within ±1%, so not.
  constexpr bool kSplitCopies = kSlotCount > 16;
  constexpr int kCopyLanes = kSplitCopies ? 16 : 32;
  ring.init(kConsumers * 128, kSplitCopies ? 4 : 3);  // empty: every consumer thread; full: the producer warps

  // Producer: warp 0 copies the X tiles and derives the sub-blocks each consumer computes, warp 1 (and
  // 3) the present W blocks, warp 2 writes zeros into the absent slots that do not hold them yet (the
  // consumers' wgmmas cover every slot of an operand they compute). Zeros from a warp's 16-byte stores
  // instead of TMA copies from past the end of W (which TMA zero-fills): TMA moves a box row by row, a
  // few cycles a row, and a slot is b rows of 2·b bytes. Shared memory is addressed from stages_s and
  // the barriers' addresses, so that a step converts no pointer (the producer's and consumers'
  // per-step instructions bound the step at low density: docs/PERFORMANCE.md).
  if (warpgroup == 0) {
    if constexpr (kConsumers == 2) warpgroup_release_registers<40>();
    const int pwarp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (pwarp > (kSplitCopies ? 3 : 2)) return;
    const bool copier = pwarp == 1 || pwarp == 3;
    // a copier lane's slot: warp 1 from 0, warp 3 from 16; warp 2's lane i zeros slot i
    const int slot = (pwarp == 3 ? kCopyLanes : 0) + lane;
    const bool mine = slot < kSlotCount && (!copier || lane < kCopyLanes);
    // Warp 0 reads a step's record head (chunk and pattern), the other warps the pattern and each
    // lane the W block of its slot: one step ahead, so that the read from L2 overlaps the wait for a
    // free stage and the previous step's copies.
    struct Read {
      unsigned pattern;
      int value;  // warp 0: the chunk; warps 1 and 3: the W block of the lane's slot
    };
    auto read = [&](int s) {
      const int* r = Cfg::steps() + s * kRecord;
      return Read{static_cast<unsigned>(r[1]), pwarp == 0 ? r[0] : copier && mine ? r[2 + slot] : 0};
    };
    unsigned zeroed = 0;  // warp 2, bit s: slot lane of stage s holds zeros
    RingCursor<S> pos;    // this CTA's steps so far, over all its tiles
    WaveGate wave(Cfg::kWaveGate ? workspace : nullptr, tiles / static_cast<int>(gridDim.x));  // paced by warp 0, which copies X
    int round = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++round) {
      const int group = tile % groups, m0 = tile / groups * BM;
      const int begin = Cfg::group_steps()[group * kClasses], end = Cfg::group_steps()[(group + 1) * kClasses];
      if (pwarp == 0) wave.wait(round);
      Read next{};
      if (begin < end) next = read(begin);
      for (int s = begin; s < end; ++s, pos.advance()) {
        const Read now = next;
        if (s + 1 < end) next = read(s + 1);
        const int stage = pos.stage;
        mbarrier_wait(empty_s + 8 * stage, pos.phase ^ 1u);
        const unsigned bar = full_s + 8 * stage, x_s = stages_s + stage * Plan::kStageBytes;
        if (pwarp == 0) {
          if (lane == 0) {
            int* record = records + stage * Plan::kStageRecord;
            // Derived for every kernel, though only kSkipEmpty's consumers read them: derived only
            // there (the rest unchanged) the kernels without the skip ran 3.3-3.5% slower at b = 16
            // d = 0.5, forward and backward-data (suite W, two rounds; twice, with the X copy moved
            // first the other time); the rest within ±3%. Not explained.
            unsigned subs = 0;  // byte h: the sub-blocks holding one of consumer h's blocks
#pragma unroll
            for (int h = 0; h < kConsumers; ++h)
#pragma unroll
              for (int j = 0; j < kSub; ++j)
                subs |= (((now.pattern >> (j * G + h * P)) & ((1u << P) - 1)) != 0) << (8 * h + j);
            record[0] = static_cast<int>(now.pattern), record[1] = static_cast<int>(subs);
            mbarrier_arrive_expect_tx(bar, Plan::kXBytes);
            tma_load_2d(x_s, map_a, now.value * 64, m0, bar);
          }
          continue;
        }
        const bool present = mine && ((now.pattern >> slot) & 1);
        if (copier) {  // the lane's slot: its W block, if present; each warp announces its own copies
          const unsigned copies = __ballot_sync(0xffffffffu, present);
          if (lane == 0) mbarrier_arrive_expect_tx(bar, __popc(copies) * Plan::kSlotBytes);
          __syncwarp();
          if (present) tma_load_2d(x_s + Plan::kXBytes + slot * Plan::kSlotBytes, map_w, 0, now.value * b, bar);
          continue;
        }
        // warp 2: zeros into the absent slots that hold a block of an earlier step in this stage
        const bool zero = lane < kSlotCount && !present && !((zeroed >> stage) & 1);
        zeroed = present ? zeroed & ~(1u << stage) : zeroed | (1u << stage);
        unsigned char* slots = slots_of(stage);
#pragma unroll 1
        for (unsigned rest = __ballot_sync(0xffffffffu, zero); rest != 0; rest &= rest - 1) {
          Chunk16* slot = reinterpret_cast<Chunk16*>(slots + (__ffs(rest) - 1) * Plan::kSlotBytes);
#pragma unroll
          for (int e = lane; e < Plan::kSlotBytes / 16; e += 32) slot[e] = Chunk16{0u, 0u, 0u, 0u};
        }
        fence_proxy_async();  // the zeros, for the wgmmas that read them
        __syncwarp();
        if (lane == 0) mbarrier_arrive(bar);
      }
      if (pwarp == 0 && lane == 0) wave.arrive(round);
    }
    if (pwarp == 0 && lane == 0) wave.finish();
    return;
  }

  if constexpr (kConsumers == 2) warpgroup_claim_registers<232>();
  const int consumer = warpgroup - 1, first_slot = consumer * P;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  unsigned char* out_tile = out_tiles + consumer * Plan::kOutTileBytes;
  // The operands' descriptors in stage 0: A at slot (0, first_slot) (forward: W's rows are reduction
  // indices, so A is M-major: rows of b outputs, the slots' atoms kSlotBytes apart along M;
  // backward-data: rows are outputs, K-major, the slots' rows following each other), B the X tile
  // (K-major, 128-byte rows). A step adds its stage's offset, a wgmma its sub-block's and k16 slice's.
  const unsigned long long a0 = smem_descriptor_swizzled<kRowBytes>(
      stages_s + Plan::kXBytes + first_slot * Plan::kSlotBytes, Cfg::kTransW ? 16 : Plan::kSlotBytes, 8 * kRowBytes);
  const unsigned long long b0 = smem_descriptor_swizzled<128>(stages_s, 16, kSwizzleAtomBytes);
  RingCursor<S> pos;  // this CTA's steps so far, over all its tiles
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int group = tile % groups, m0 = tile / groups * BM;
    const int* bounds = Cfg::group_steps() + group * kClasses;
    float d[BM / 2];  // Yᵀ: 64 outputs (the consumer's columns) × BM rows
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) d[i] = 0.0f;
    wgmma_fence_registers(d);
    // A stage is released once its wgmmas have finished: with two consumers at once (the other
    // consumer's wgmmas keep the tensor cores busy meanwhile), with one after the next step's wgmmas
    // are issued. Measured, two consumers at once against a step later: suite W at b = 16 and 32,
    // +0.4-1.9% in 28 of 32 cells, b = 32 d = 0.5 -0.6%.
    constexpr bool kReleaseAtOnce = kConsumers > 1;
    int pending = -1;  // one consumer: the stage of the last step whose wgmmas may still read it (-1: none)
    // A group's steps come in classes (kClasses): blocks for both consumers, for consumer 0 only, for
    // consumer 1 only. A consumer computes the steps of its classes and releases the others at
    // once. Loops whose trip counts differ, not a branch per step: a branch around the wgmmas makes
    // ptxas serialize them (C7520).
#pragma unroll 1
    for (int cls = 0; cls < kClasses; ++cls) {
      const bool mine = cls == 0 || cls == 1 + consumer;
      const int count = bounds[cls + 1] - bounds[cls];
      for (int i = 0, n = mine ? count : 0; i < n; ++i, pos.advance()) {
        const int stage = pos.stage, step = bounds[cls] + i;
        mbarrier_wait(full_s + 8 * stage, pos.phase);
        const int* record = records + stage * Plan::kStageRecord;
        unsigned char* slots = slots_of(stage);
        const unsigned long long a = smem_descriptor_add(a0, stage * Plan::kStageBytes),
                                 x = smem_descriptor_add(b0, stage * Plan::kStageBytes);
        auto held_slots = [&] {  // bit j · P + c: this consumer's slot (j, c) holds a block
          const unsigned pattern = record[0];
          unsigned held = 0;
#pragma unroll
          for (int j = 0; j < kSub; ++j) held |= ((pattern >> (j * G + first_slot)) & ((1u << P) - 1)) << (j * P);
          return held;
        };
        if (gate != nullptr) {
          gate_slots<Cfg>(
              held_slots(), gate, [&](int j, int c) { return slots + (j * G + first_slot + c) * Plan::kSlotBytes; },
              [&](int j, int c) { return Cfg::steps()[step * kRecord + 2 + j * G + first_slot + c]; }, consumer);
        }
        auto sub_block = [&](int j) {  // the wgmmas of sub-block j
#pragma unroll
          for (int kk = 0; kk < b / 16; ++kk) {
            // A: sub-block j's slots, 64 outputs × 16 reduction indices; B: 16 reduction indices × BM rows of X
            const unsigned long long da =
                smem_descriptor_add(a, j * G * Plan::kSlotBytes + (Cfg::kTransW ? kk * 32 : kk * 16 * kRowBytes));
            wgmma_m64k16<T, BM, Cfg::kTransW ? 0 : 1, 0>(d, da, smem_descriptor_add(x, j * 2 * b + kk * 32));
          }
        };
        if constexpr (Cfg::kSkipEmpty) {
          // Only the sub-blocks where one of this consumer's slots holds a block (the others hold
          // zeros), a wgmma group each: ptxas keeps the wgmmas pipelined in a loop whose body is
          // fence, wgmmas, commit (with the commit after the loop it serializes them, C7520).
          // The generator sets kSkipEmpty where under 0.9 of the computed sub-blocks hold a block:
          // measured (suite W, balanced and Bernoulli, since the steps convert no pointers), b = 32
          // at d = 0.5 (fill 0.82) +7%, d = 0.25 (0.66) +8-11%, b = 16 at d = 0.25 (0.71) +3%,
          // d = 0.5 (0.94) -7%; before, b = 16 at d = 0.1 (0.47) and 0.05 (0.39) +3-5%.
          // bit j: sub-block j holds one of this consumer's blocks (derived by the producer)
          const unsigned subs = (static_cast<unsigned>(record[1]) >> (8 * consumer)) & 0xffu;
#pragma unroll 1
          for (unsigned rest = subs; rest != 0; rest &= rest - 1) {
            wgmma_fence();
            sub_block(__ffs(rest) - 1);
            wgmma_commit();
          }
        } else {
          wgmma_fence();
#pragma unroll
          for (int j = 0; j < kSub; ++j) sub_block(j);
          wgmma_commit();
        }
        if constexpr (kReleaseAtOnce) {
          wgmma_wait<0>();
          mbarrier_arrive(empty_s + 8 * stage);
        } else {
          wgmma_wait<1>();  // the previous computed step's wgmmas have finished: release its stage
          if (pending >= 0) mbarrier_arrive(empty_s + 8 * pending);
          pending = stage;
        }
      }
      for (int i = 0, n = mine ? 0 : count; i < n; ++i, pos.advance()) {  // none of this consumer's blocks
        if (pending >= 0) {  // the producer may need that stage before this run ends
          wgmma_wait<0>();
          mbarrier_arrive(empty_s + 8 * pending);
          pending = -1;
        }
        mbarrier_wait(full_s + 8 * pos.stage, pos.phase);
        mbarrier_arrive(empty_s + 8 * pos.stage);
      }
    }
    wgmma_wait<0>();
    if (pending >= 0) mbarrier_arrive(empty_s + 8 * pending);
    wgmma_fence_registers(d);

    // Accumulator d[4i + 2h + e] is output 16·warp + 8h + lane / 4 (column (that) / b, feature (that) % b)
    // of row 8i + 2·(lane % 4) + e.
    const int* columns = Cfg::group_columns() + group * G + first_slot;
    // Through the consumer's output tile in shared memory, kOutRows rows at a time: row r holds the 64
    // outputs in 16-byte chunks, chunk j of row r at j ^ (r % 8) (the 8 rows one stmatrix tile writes
    // fall in distinct banks). With accumulate, Y's rows come in first the same way, and ldmatrix.trans
    // hands each thread the old values of its accumulators (added in fp32, rounded once). The tile is
    // free at the start: the previous tile's last part ended with a barrier after its reads.
    constexpr int kOutRows = Plan::kOutRows, kChunksPerColumn = b / 8;
    auto copy_part = [&](int part, bool to_tile) {  // the chunks of the tile's rows that Y holds, 16 bytes each
#pragma unroll 4
      for (int e = threadIdx.x % 128; e < kOutRows * 8; e += 128) {
        const int row = e / 8, chunk = e % 8, col = columns[chunk / kChunksPerColumn];
        const long long m = static_cast<long long>(m0) + part * kOutRows + row;
        if (col < 0 || m >= n) continue;
        Chunk16* y = reinterpret_cast<Chunk16*>(out + m * Cfg::kOutDim + col * b + (chunk % kChunksPerColumn) * 8);
        Chunk16* t = reinterpret_cast<Chunk16*>(out_tile + swizzled_offset(row, chunk));
        if (to_tile) *t = *y;
        else *y = *t;
      }
      named_barrier_sync(1 + consumer, 128);
    };
#pragma unroll
    for (int i = 0; i < BM / 8; i += 2) {
      const int part = i / (kOutRows / 8);
      if (accumulate && i % (kOutRows / 8) == 0)
        copy_part(part, true);
      // stmatrix (ldmatrix) tile q: rows 8 (i + q / 2) .., outputs 16·warp + 8 (q % 2) ..
      const int q = lane / 8, row = (8 * (i + q / 2) + lane % 8) % kOutRows, chunk = 2 * warp + q % 2;
      unsigned char* at = out_tile + swizzled_offset(row, chunk);
      if (accumulate) add_ldmatrix<T, true>(d + 4 * i, at);
      const unsigned r[4] = {pack_pair<T>(d[4 * i], d[4 * i + 1]), pack_pair<T>(d[4 * i + 2], d[4 * i + 3]),
                             pack_pair<T>(d[4 * i + 4], d[4 * i + 5]), pack_pair<T>(d[4 * i + 6], d[4 * i + 7])};
      stmatrix_x4_trans(at, r);
      if ((i + 2) % (kOutRows / 8) == 0) {
        named_barrier_sync(1 + consumer, 128);
        copy_part(part, false);
      }
    }
  }
}

}  // namespace kernels
}  // namespace bsjit
