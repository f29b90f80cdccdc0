// dsd_grouped_kernel: forward Y = X·W and backward-data dX = dY·Wᵀ on Hopper (sm_90a) for blocks
// of 16 and 32, where one output block column is too narrow to feed the tensor cores from one X
// tile (docs/PERFORMANCE.md, "b ≤ 32").
//
// One CTA tile is BM rows × a group of kColumns output block columns chosen by the generator. The
// CTA walks the union of the group's input blocks, one step per input block: a TMA copy of the X
// tile (BM rows × b reduction indices) and of the W block of every group column that holds that
// input block, into fixed slots of the stage. Each consumer warpgroup then issues, per column, a
// narrow wgmma (m64 n16/n32 k16) for each column of the step's pattern: an X tile loaded once feeds
// every block of its row in the group, and absent blocks cost no tensor-core time.
//
// Warp-specialized and persistent as dsd_tma_kernel: warpgroup 0 produces (one thread issues the
// copies), kWarpsM consumer warpgroups own BM / kWarpsM rows each; stages complete on "full"
// mbarriers and are released on "empty" ones; a wave of CTAs loops over (group, row tile) tiles.
// Shared memory is swizzled over one block row (2·b bytes: 64 at b = 32, 32 at b = 16).
//
// Tables (generated): a group's steps are ordered by column pattern (the subset of its columns
// holding the input block), then input block: kPatternSteps[g·2^kColumns + p] is the first step of
// group g with pattern p (p = 0 has none; the entry after the last pattern starts the next group).
// Step s is (input block, pattern) at kSteps[2s], kSteps[2s+1], with the W block index of slot c at
// kStepBlocks[s·kColumns + c] (0 where the pattern lacks c); kGroupColumns[g·kColumns + c] is the
// output block column of slot c (-1 past the last column).
#pragma once

#include "bsjit/matmul.cuh"

namespace bsjit {
namespace kernels {

template <class Cfg>
struct DsdGroupedPlan {
  static constexpr int kRowBytes = 2 * Cfg::kBlock;  // one swizzled row: b 16-bit elements
  static constexpr int kABytes = Cfg::kBM * kRowBytes;
  static constexpr int kSlotBytes = Cfg::kBlock * kRowBytes;
  static constexpr int kStageBytes = kABytes + Cfg::kColumns * kSlotBytes;
  static constexpr int kSharedBytes = Cfg::kStages * kStageBytes + kSwizzleAtomBytes + 2 * Cfg::kStages * 8;
  static constexpr int kPatterns = 1 << Cfg::kColumns;  // column subsets (the empty one has no steps)
};

// Scales the W blocks of a stage by their gates (a block gated to 0 is zeroed, so that it adds
// nothing even where W holds infinities). Every consumer thread calls it with the same arguments.
template <class Cfg>
__device__ __forceinline__ void gate_stage(const float* gate, int step, int pattern, unsigned char* slots) {
  using Plan = DsdGroupedPlan<Cfg>;
  constexpr int kConsumerThreads = Cfg::kWarpsM * 128;
  bool scaled = false;
#pragma unroll 1
  for (int c = 0; c < Cfg::kColumns; ++c) {  // not unrolled: one copy of this per pattern loop
    if (!((pattern >> c) & 1)) continue;
    const float g = gate[Cfg::step_blocks()[step * Cfg::kColumns + c]];
    if (g == 1.0f) continue;
    unsigned* words = reinterpret_cast<unsigned*>(slots + c * Plan::kSlotBytes);
#pragma unroll 1
    for (int i = threadIdx.x - 128; i < Plan::kSlotBytes / 4; i += kConsumerThreads)
      words[i] = g == 0.0f ? 0u : scale_pair<typename Cfg::T>(words[i], g);
    scaled = true;
  }
  if (scaled) {
    fence_proxy_async();
    named_barrier_sync(1, kConsumerThreads);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dsd_grouped_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                       typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
                       float* __restrict__ workspace, const __grid_constant__ TensorMap map_a,
                       const __grid_constant__ TensorMap map_w) {
  using T = typename Cfg::T;
  using Plan = DsdGroupedPlan<Cfg>;
  constexpr int b = Cfg::kBlock, G = Cfg::kColumns, S = Cfg::kStages, kRowBytes = Plan::kRowBytes;
  constexpr int kConsumers = Cfg::kWarpsM, kConsumerThreads = kConsumers * 128;
  constexpr int kRows = Cfg::kBM / kConsumers, kTiles = kRows / 64, kPatterns = Plan::kPatterns;
  // Steps whose wgmmas may still run while the next is issued: a step's products are few (one to
  // four narrow wgmmas per m64 tile), so waiting for the previous one alone leaves the tensor
  // cores idle for most of a wgmma's latency. Half the stages hold wgmmas, half are being loaded.
  constexpr int kInFlight = S / 2 - 1 < 1 ? 1 : S / 2 - 1 > 4 ? 4 : S / 2 - 1;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && (b == 16 || b == 32), "16-bit, feature axis last, b = 16 or 32");
  static_assert(G >= 1 && G <= 4, "groups of up to 4 columns (15 column patterns)");
  static_assert(Cfg::kThreads == kConsumerThreads + 128 && kRows * kConsumers == Cfg::kBM && kTiles * 64 == kRows,
                "one producer warpgroup, kWarpsM consumer warpgroups owning whole m64 tiles");
  static_assert(S >= 2 && Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_address(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                    (kSwizzleAtomBytes - 1));
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + S * Plan::kStageBytes);
  unsigned long long* empty = full + S;
  auto stage_a = [&](int step) { return smem + (step % S) * Plan::kStageBytes; };
  auto stage_w = [&](int step) { return smem + (step % S) * Plan::kStageBytes + Plan::kABytes; };

  const int warpgroup = threadIdx.x / 128;
  const int tiles = Cfg::kGroups * ((n + Cfg::kBM - 1) / Cfg::kBM);  // group fastest: CTAs share X rows in L2
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], kConsumerThreads);
    fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer
    if (threadIdx.x != 0) return;
    // A step's table entries, read one step ahead: a read from L2 (hundreds of cycles) then
    // overlaps the wait for a free stage and the previous step's copies.
    struct Entry {
      int in = 0, pattern = 0, blocks[G];
      __device__ void read(int s) {
        in = Cfg::steps()[2 * s], pattern = Cfg::steps()[2 * s + 1];
#pragma unroll
        for (int c = 0; c < G; ++c) blocks[c] = Cfg::step_blocks()[s * G + c];
      }
    };
    int step = 0;  // this CTA's stages so far, over all its tiles
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int group = tile % Cfg::kGroups, m0 = tile / Cfg::kGroups * Cfg::kBM;
      const int begin = Cfg::pattern_steps()[group * kPatterns], end = Cfg::pattern_steps()[(group + 1) * kPatterns];
      Entry next;
      if (begin < end) next.read(begin);
      for (int s = begin; s < end; ++s, ++step) {
        const Entry e = next;
        if (s + 1 < end) next.read(s + 1);
        const int round = step / S;
        if (round > 0) mbarrier_wait(&empty[step % S], (round - 1) & 1);
        unsigned long long* bar = &full[step % S];
        mbarrier_arrive_expect_tx(bar, Plan::kABytes + __popc(e.pattern) * Plan::kSlotBytes);
        tma_load_2d(stage_a(step), map_a, e.in * b, m0, bar);
#pragma unroll
        for (int c = 0; c < G; ++c)
          if ((e.pattern >> c) & 1) tma_load_2d(stage_w(step) + c * Plan::kSlotBytes, map_w, 0, e.blocks[c] * b, bar);
      }
    }
    return;
  }

  const int consumer = warpgroup - 1;
  int step = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int group = tile % Cfg::kGroups, m0 = tile / Cfg::kGroups * Cfg::kBM;
    const int* bounds = Cfg::pattern_steps() + group * kPatterns;
    const int first_step = step;
    float d[kTiles][G][b / 2];
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int c = 0; c < G; ++c) {
#pragma unroll
        for (int i = 0; i < b / 2; ++i) d[t][c][i] = 0.0f;
        wgmma_fence_registers(d[t][c]);
      }
    // One loop per column pattern, so that which accumulators a step's wgmmas update is known at
    // compile time (a predicate or branch per wgmma makes ptxas serialize the wgmma pipeline).
#pragma unroll
    for (int p = 1; p < kPatterns; ++p) {
      for (int s = bounds[p], end = bounds[p + 1]; s < end; ++s, ++step) {
        mbarrier_wait(&full[step % S], (step / S) & 1);
        unsigned char* ws = stage_w(step);
        if (gate != nullptr) gate_stage<Cfg>(gate, s, p, ws);
        const unsigned char* as = stage_a(step) + consumer * kRows * kRowBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < b / 16; ++kk) {
#pragma unroll
          for (int t = 0; t < kTiles; ++t) {
            // X: K-major, 16 reduction indices = 32 bytes along each row; atoms of 8 rows
            const unsigned long long da =
                smem_descriptor_swizzled<kRowBytes>(as + t * 64 * kRowBytes + kk * 32, 16, 8 * kRowBytes);
#pragma unroll
            for (int c = 0; c < G; ++c) {
              if (!((p >> c) & 1)) continue;
              // forward: W block rows are reduction indices (N-major), 16 rows further on;
              // backward-data: rows are output indices (K-major), 32 bytes further along each
              const unsigned char* wb = ws + c * Plan::kSlotBytes;
              const unsigned long long db =
                  Cfg::kTransW ? smem_descriptor_swizzled<kRowBytes>(wb + kk * 32, 16, 8 * kRowBytes)
                               : smem_descriptor_swizzled<kRowBytes>(wb + kk * 16 * kRowBytes, b * kRowBytes,
                                                                     8 * kRowBytes);
              wgmma_m64k16_narrow<T, b, Cfg::kTransW ? 0 : 1>(d[t][c], da, db);
            }
          }
        }
        wgmma_commit();
        wgmma_wait<kInFlight>();  // the wgmmas of step - kInFlight have finished: release its stage
        if (step - kInFlight >= first_step) mbarrier_arrive(&empty[(step - kInFlight) % S]);
      }
    }
    wgmma_wait<0>();
    for (int r = max(first_step, step - kInFlight); r < step; ++r) mbarrier_arrive(&empty[r % S]);  // the tile's last
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int c = 0; c < G; ++c) wgmma_fence_registers(d[t][c]);

#pragma unroll
    for (int c = 0; c < G; ++c) {
      const int col = Cfg::group_columns()[group * G + c];
      if (col < 0) continue;
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
        wgmma_epilogue<b>(d[t][c], consumer * kRows + t * 64, [&](int r, int cc, float v0, float v1) {
          const long long m = static_cast<long long>(m0) + r;
          if (m >= n) return;
          store_pair(out + m * Cfg::kOutDim + static_cast<long long>(col) * b + cc, v0, v1, accumulate);
        });
    }
  }
}

}  // namespace kernels
}  // namespace bsjit
