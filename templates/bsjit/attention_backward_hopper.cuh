// Block-sparse attention, fused backward on Hopper (sm_90a): the main kernel of
// attention_backward.cuh's three (the prep and dQ-conversion kernels are the same), with warpgroup
// tensor cores fed by TMA.
//
// A CTA takes 128 keys of one (batch, head): one key block of 128, or a pair of key blocks of 64.
// Warpgroup 0 holds the producers: per stream (the block's column of the mask, or each of the
// pair's two columns) one thread copies the stream's K and V rows once, then for each query tile
// of kQTile = 64 rows in the column (the generator's column LUT) its Q and dO tiles and their
// log-sum-exp and Delta into a kStages-deep ring (full and empty mbarriers). Two consumer
// warpgroups own 64 keys each, rows of their products, and per query tile of their stream:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (operands in shared memory, K-major), issued together;
//   Pᵀ = exp2(scale_log2 · Sᵀ − lse · log2 e) in registers (masked pairs 0), dV += Pᵀ·dO (P from
//   registers, dO MN-major);
//   dSᵀ = Pᵀ ∘ (dPᵀ − Delta), dK += dSᵀ·Q, and dSᵀ to shared memory;
//   dQ = dS·K from shared memory (dSᵀ MN-major as A, K MN-major). A block of 128 with head dim
//   128: both consumers' dSᵀ feed one product over the block's keys, each consumer taking 64 of
//   dQ's columns (dSᵀ double-buffered, a named barrier between them); otherwise each consumer
//   multiplies its own 64 keys, 64 columns of dQ at a time.
// dQ's products go to the fp32 accumulator. With one stream (block 128) the consumers store them
// to shared memory in their fragments' order and go on, and warp 1 of the producers adds the tile
// to the accumulator with one bulk reduction (the accumulator's tiles of 64 rows are in that order:
// attention_backward_dq_tiles_kernel reads them); the pair's two streams (block 64) meet different
// query tiles, and each consumer adds its own with 8-byte reductions.
#pragma once

#include "bsjit/attention_backward.cuh"
#include "bsjit/attention_hopper.cuh"

namespace bsjit {
namespace kernels {

template <class Cfg>
struct AttentionBackwardTmaPlan {
  static constexpr bool kPaired = Cfg::kBlock == 64;  // two key blocks, two streams
  static constexpr int kStreams = kPaired ? 2 : 1;
  static constexpr bool kSharedDq = !kPaired && Cfg::kHeadDim == 128;
  static constexpr int kKVBytes = Cfg::kKTile * Cfg::kHeadDim * 2;  // K or V
  static constexpr int kQBytes = Cfg::kQTile * Cfg::kHeadDim * 2;   // Q or dO of one stage
  static constexpr int kDsBytes = Cfg::kKTile * Cfg::kQTile * 2;    // dSᵀ, one buffer
  static constexpr int kDsBuffers = kSharedDq ? 2 : 1;
  static constexpr bool kBulkDq = !kPaired;
  static constexpr int kDqBytes = kBulkDq ? 2 * 64 * 64 * 4 : 0;  // a 64 × 64 fp32 product per consumer
  static constexpr int kRowBytes = Cfg::kQTile * 4;                    // lse or Delta of one stage
  static constexpr int kRing = kStreams * Cfg::kStages;                // stages of all streams
  static constexpr int kBarriers = kStreams * (1 + 2 * Cfg::kStages);  // per stream: K and V; full, empty
  static constexpr int kSharedBytes =
      2 * kKVBytes + kRing * (2 * kQBytes + 2 * kRowBytes) + kDsBuffers * kDsBytes + kDqBytes + kBarriers * 8 +
      kSwizzleAtomBytes;
  // named barriers (0 is __syncthreads): dSᵀ written (1, or 1 + consumer), dQ's shared tile
  // written by the consumers (kDqFull) and read by the bulk reduction (kDqEmpty), both counting
  // the consumers and the producers' warp 1
  static constexpr int kDqFull = 3, kDqEmpty = 4, kDqThreads = 256 + 32;
};

// Where element pair (j, e) of thread `thread`'s m64n64 accumulator (rows 16·warp + g + 8e,
// columns 8j + 2·t4 and the next) lies in a 64 × 64 dQ product of column chunk `chunk`, in floats
// from its 64-row tile: the consumers' 8-byte stores are consecutive within a warp, and a tile is
// one contiguous run for the bulk reduction.
__device__ __forceinline__ int dq_fragment_offset(int chunk, int j, int e, int thread) {
  return chunk * 64 * 64 + ((2 * j + e) * 128 + thread) * 2;
}

template <class Cfg>
__global__ void __launch_bounds__(384, 1)
    attention_backward_tma_kernel(const float* __restrict__ lse, const float* __restrict__ delta,
                                  const unsigned char* __restrict__ key_padding, float* __restrict__ dq_acc,
                                  typename Cfg::T* __restrict__ dk, typename Cfg::T* __restrict__ dv, int heads,
                                  int band, float scale_log2, float scale, const __grid_constant__ TensorMap map_q,
                                  const __grid_constant__ TensorMap map_k, const __grid_constant__ TensorMap map_v,
                                  const __grid_constant__ TensorMap map_do) {
  using T = typename Cfg::T;
  using Plan = AttentionBackwardTmaPlan<Cfg>;
  constexpr int D = Cfg::kHeadDim, QT = Cfg::kQTile, KT = Cfg::kKTile, S = Cfg::kStages;
  constexpr int kSub = Cfg::kBlock / QT, kStreamKeys = KT / Plan::kStreams;
  const int seq_q = Cfg::q_blocks() * Cfg::kBlock, seq_k = Cfg::k_blocks() * Cfg::kBlock;
  static_assert(sizeof(T) == 2 && (D == 64 || D == 128) && QT == 64 && KT == 128 &&
                    (Cfg::kBlock == 64 || Cfg::kBlock == 128) && S >= 2,
                "16-bit; head dim 64 or 128; query tiles of 64; 128 keys per CTA, 64 per consumer");
  static_assert(Plan::kSharedBytes == Cfg::kBackwardSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = swizzle_aligned(smem_raw);
  // K, V ([panel][KT rows]), then per ring slot r = stream · S + stage: Q, dO, dSᵀ, lse, Delta, barriers
  unsigned char* ks = smem;
  unsigned char* vs = ks + Plan::kKVBytes;
  auto qs = [&](int r) { return vs + Plan::kKVBytes + r * Plan::kQBytes; };
  auto dos = [&](int r) { return vs + Plan::kKVBytes + (Plan::kRing + r) * Plan::kQBytes; };
  unsigned char* dss = vs + Plan::kKVBytes + 2 * Plan::kRing * Plan::kQBytes;
  float* dq_s = reinterpret_cast<float*>(dss + Plan::kDsBuffers * Plan::kDsBytes);  // [consumer][64 · 64]
  float* lse_s = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(dq_s) + Plan::kDqBytes);  // [ring][QT]
  float* delta_s = lse_s + Plan::kRing * QT;
  unsigned long long* kv_full = reinterpret_cast<unsigned long long*>(delta_s + Plan::kRing * QT);  // [streams]
  unsigned long long* full = kv_full + Plan::kStreams;                                              // [ring]
  unsigned long long* empty = full + Plan::kRing;

  const BandedTile cta((seq_k + KT - 1) / KT, band);  // attention.cuh
  const int b = cta.bh / heads, h = cta.bh % heads;
  const long long bh = cta.bh;
  const int k0 = Cfg::key_tile_order()[cta.rank] * KT;
  const int layout = Cfg::kLayouts == 1 ? 0 : h;
  // stream st: block column k0 / block + st, its query tiles (none past the last column)
  auto column = [&](int st) { return k0 / Cfg::kBlock + st; };
  auto begin_of = [&](int st) { return Cfg::col_start()[layout * Cfg::k_blocks() + column(st)]; };
  auto total_of = [&](int st) {
    return column(st) < Cfg::k_blocks()
               ? (Cfg::col_start()[layout * Cfg::k_blocks() + column(st) + 1] - begin_of(st)) * kSub
               : 0;
  };
  auto query0 = [&](int begin, int step) {
    return Cfg::query_blocks()[begin + step / kSub] * Cfg::kBlock + (step % kSub) * QT;
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < Plan::kStreams; ++st) mbarrier_init(&kv_full[st], 1);
    for (int r = 0; r < Plan::kRing; ++r) mbarrier_init(&full[r], 1), mbarrier_init(&empty[r], 256 / Plan::kStreams);
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {  // producers: lane 0 of warp st for stream st; warp 1 adds dQ (one stream)
    // 24 registers a thread, the consumers 240: 128 · 24 + 256 · 240 is the CTA's 384 · 168 at launch
    // (the dQ warp spills 56 bytes in its loop at 24; the consumers spill at 232)
    warpgroup_release_registers<24>();
    const int st = threadIdx.x / 32;
    if constexpr (Plan::kBulkDq) {
      if (st == 1) {
        const int begin = begin_of(0), total = total_of(0);
        for (int i = 0; i < total; ++i) {
          named_barrier_sync(Plan::kDqFull, Plan::kDqThreads);
          if (threadIdx.x % 32 == 0) {
            // both column chunks (head dim 128) or both consumers' partial products (64)
            float* tile = dq_acc + (bh * seq_q + query0(begin, i)) * D;
            if constexpr (Plan::kSharedDq) {
              bulk_reduce_add(tile, dq_s, Plan::kDqBytes);
            } else {
              bulk_reduce_add(tile, dq_s, Plan::kDqBytes / 2);
              bulk_reduce_add(tile, dq_s + 64 * 64, Plan::kDqBytes / 2);
            }
            bulk_commit_group();
            bulk_wait_group_read<0>();
          }
          __syncwarp();
          if (i + 1 < total) named_barrier_arrive(Plan::kDqEmpty, Plan::kDqThreads);
        }
        if (threadIdx.x % 32 == 0) bulk_wait_group<0>();
        return;
      }
    }
    if (threadIdx.x % 32 != 0 || st >= Plan::kStreams) return;
    const int begin = begin_of(st), total = total_of(st);
    if (total == 0) return;
    auto load = [&](unsigned char* dst, const TensorMap& map, int seq, int p, int stride_rows,
                    unsigned long long* bar) { tma_load_rows<Cfg>(dst, map, b, h, heads, seq, p, stride_rows, bar); };
    const KvHead<Cfg> kv(h, heads);  // K and V: maps over heads / kKvGroup heads
    mbarrier_arrive_expect_tx(&kv_full[st], 2 * Plan::kKVBytes / Plan::kStreams);
    const int key_row = st * kStreamKeys;
    tma_load_rows<Cfg>(ks + key_row * kSwizzleRowBytes, map_k, b, kv.head, kv.heads, seq_k, k0 + key_row, KT,
                       &kv_full[st]);
    tma_load_rows<Cfg>(vs + key_row * kSwizzleRowBytes, map_v, b, kv.head, kv.heads, seq_k, k0 + key_row, KT,
                       &kv_full[st]);
    for (int i = 0; i < total; ++i) {
      const int r = st * S + i % S, q0 = query0(begin, i);
      if (i >= S) mbarrier_wait(&empty[r], (i / S - 1) & 1);
      mbarrier_arrive_expect_tx(&full[r], 2 * Plan::kQBytes + 2 * Plan::kRowBytes);
      load(qs(r), map_q, seq_q, q0, QT, &full[r]);
      load(dos(r), map_do, seq_q, q0, QT, &full[r]);
      bulk_load(lse_s + r * QT, lse + bh * seq_q + q0, Plan::kRowBytes, &full[r]);
      bulk_load(delta_s + r * QT, delta + bh * seq_q + q0, Plan::kRowBytes, &full[r]);
    }
    return;
  }
  warpgroup_claim_registers<240>();

  const int consumer = warpgroup - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, g = lane / 4,
            t4 = lane % 4;
  const int st = Plan::kPaired ? consumer : 0, begin = begin_of(st), total = total_of(st);
  const int row0 = consumer * 64;  // this consumer's keys: rows of the K and V tiles, k0 + row0 on
  const int my_key[2] = {k0 + row0 + warp * 16 + g, k0 + row0 + warp * 16 + g + 8};
  bool live[2] = {true, true};
  if (key_padding != nullptr && row0 + k0 < seq_k)
    for (int r = 0; r < 2; ++r) live[r] = key_padding[static_cast<long long>(b) * seq_k + my_key[r]] != 0;
  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
  const unsigned char* ka = ks + row0 * kSwizzleRowBytes;
  const unsigned char* va = vs + row0 * kSwizzleRowBytes;
  constexpr float kLog2e = 1.4426950408889634f;
  // dQ: the keys this consumer multiplies, in parts of 64 columns (see the top)
  constexpr int kDqKeys = Plan::kSharedDq ? KT : 64, kDqParts = Plan::kSharedDq ? 1 : D / 64;
  const int dq_key0 = Plan::kSharedDq ? 0 : row0;

  if (total > 0) mbarrier_wait(&kv_full[st], 0);
  for (int i = 0; i < total; ++i) {
    const int r = st * S + i % S, q0 = query0(begin, i);
    mbarrier_wait(&full[r], (i / S) & 1);
    float sc[QT / 2], dpt[QT / 2];
    wgmma_fence();
    wgmma_k_major_tiles<T, QT, D>(sc, ka, KT, qs(r), QT, true);
    wgmma_commit();
    wgmma_k_major_tiles<T, QT, D>(dpt, va, KT, dos(r), QT, true);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_registers(sc);

    // Pᵀ: rows are this thread's keys, columns 8j + 2·t4 (+1) the tile's queries
    const float* ls = lse_s + r * QT;
    const bool causal_here = Cfg::kCausal && k0 + row0 + 63 > q0;
    bool quadrant = true;  // a block-64 mask on tiles of 128: this consumer's 64 keys and the 64 queries live
    if constexpr (Quadrants<Cfg>::kOn)
      quadrant = Cfg::query_quadrants()[begin + i / kSub] >> (2 * ((q0 / 64) & 1) + ((k0 + row0) / 64 & 1)) & 1;
#pragma unroll
    for (int j = 0; j < QT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query = 8 * j + 2 * t4 + (e & 1);
        const float l = ls[query];
        const float lg = l == minus_infinity() ? -minus_infinity() : l * kLog2e;  // no key: P = 0
        const bool keep = quadrant && live[e >> 1] && !(causal_here && my_key[e >> 1] > q0 + query);
        sc[4 * j + e] = keep ? fast_exp2(fmaf(sc[4 * j + e], scale_log2, -lg)) : 0.0f;
      }
    unsigned pa[QT / 16][4];
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[c][e] = pack_pair<T>(sc[8 * c + 2 * e], sc[8 * c + 2 * e + 1]);
    wgmma_fence();
    wgmma_registers_mn_major_tile<T, D, QT>(dv_acc, pa, dos(r), QT);
    wgmma_commit();
    wgmma_wait<1>();  // dPᵀ (the dV product may still run)
    wgmma_fence_registers(dpt);

    // dSᵀ = Pᵀ ∘ (dPᵀ − Delta), as A fragments and into shared memory (row = key, column = query)
    const float* dl = delta_s + r * QT;
    unsigned char* ds_tile = dss + (Plan::kSharedDq ? (i % 2) * Plan::kDsBytes : 0);
    unsigned da[QT / 16][4];
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 2 * c + (e >> 1), e0 = 4 * j + 2 * (e & 1), query = 8 * j + 2 * t4;
        da[c][e] = pack_pair<T>(sc[e0] * (dpt[e0] - dl[query]), sc[e0 + 1] * (dpt[e0 + 1] - dl[query + 1]));
        const int key_row = row0 + warp * 16 + g + 8 * (e & 1);
        *reinterpret_cast<unsigned*>(ds_tile + swizzled_offset(key_row, j) + 4 * t4) = da[c][e];
      }
    fence_proxy_async();
    wgmma_fence();
    wgmma_registers_mn_major_tile<T, D, QT>(dk_acc, da, qs(r), QT);
    wgmma_commit();
    // every writer of the dSᵀ rows the dQ product reads is done
    if constexpr (Plan::kSharedDq)
      named_barrier_sync(1, 256);
    else
      named_barrier_sync(1 + consumer, 128);
    float* acc = dq_acc + (bh * seq_q + q0) * D;
    static_assert(!Plan::kBulkDq || kDqParts == 1, "one 64 x 64 product per consumer and step");
#pragma unroll
    for (int part = 0; part < kDqParts; ++part) {
      const int col0 = Plan::kSharedDq ? consumer * 64 : part * 64;  // dQ columns = K's panel
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kDqKeys / 16; ++c)
        wgmma_m64k16<T, 64, 1, 1>(
            dq,
            smem_descriptor(ds_tile + (dq_key0 + c * 16) * kSwizzleRowBytes, KT * kSwizzleRowBytes, kSwizzleAtomBytes),
            smem_descriptor(ks + (col0 / 64) * KT * kSwizzleRowBytes + (dq_key0 + c * 16) * kSwizzleRowBytes,
                            KT * kSwizzleRowBytes, kSwizzleAtomBytes),
            c > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_registers(dq);
      if constexpr (Plan::kBulkDq) {
        float* tile = dq_s + consumer * 64 * 64;
        if (i > 0) named_barrier_sync(Plan::kDqEmpty, Plan::kDqThreads);  // the last step's tile was read
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            *reinterpret_cast<float2*>(tile + dq_fragment_offset(0, j, e, threadIdx.x % 128)) =
                make_float2(dq[4 * j + 2 * e], dq[4 * j + 2 * e + 1]);
        fence_proxy_async();
        named_barrier_arrive(Plan::kDqFull, Plan::kDqThreads);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            red_add_pair(acc + (warp * 16 + g + 8 * e) * D + col0 + 8 * j + 2 * t4, dq[4 * j + 2 * e],
                         dq[4 * j + 2 * e + 1]);
      }
    }
    wgmma_fence_registers(dk_acc);
    wgmma_fence_registers(dv_acc);
    wgmma_fence_registers(pa);
    wgmma_fence_registers(da);
    mbarrier_arrive(&empty[r]);
  }

  if (k0 + row0 >= seq_k) return;  // the pair's second block past the last column
  if constexpr (Cfg::kKvGroup == 1) {
    const QkvIndex<Cfg> ki(b, h, heads, seq_k);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        store_pair(dk + ki.at(my_key[e]) + 8 * j + 2 * t4, dk_acc[4 * j + 2 * e] * scale,
                   dk_acc[4 * j + 2 * e + 1] * scale, 0);
        store_pair(dv + ki.at(my_key[e]) + 8 * j + 2 * t4, dv_acc[4 * j + 2 * e], dv_acc[4 * j + 2 * e + 1], 0);
      }
  } else {  // the group's query heads add into the key/value head's accumulators (attention_backward.cuh)
    const KeyGradientRows<Cfg> acc(delta, cta.pairs, seq_q, seq_k, b, KvHead<Cfg>(h, heads));
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float* at = acc.dk + static_cast<long long>(my_key[e]) * D + 8 * j + 2 * t4;
        red_add_pair(at, dk_acc[4 * j + 2 * e] * scale, dk_acc[4 * j + 2 * e + 1] * scale);
        red_add_pair(at + acc.dv, dv_acc[4 * j + 2 * e], dv_acc[4 * j + 2 * e + 1]);
      }
  }
}

// grid (batch · heads, seq_q / 16), 128 threads: dQ = scale · accumulator, whose tiles of 64 rows
// hold the products in their fragments' order (dq_fragment_offset). Block y takes the 16 rows of
// fragment warp y % 4 of tile y / 4. A thread takes 8 consecutive columns of a row, which 4
// consecutive lanes of the fragment warp hold: 32 contiguous bytes read, 16 written; a warp reads
// four runs of 256 bytes and writes 64 bytes to each of 8 rows. (A pair a thread, 4-byte stores a
// row apart, ran at 1.1 TB/s at d = 128: 0.36 ms; docs/PERFORMANCE.md "The backward's memory-bound
// kernels".)
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_backward_dq_tiles_kernel(const float* __restrict__ dq_acc, typename Cfg::T* __restrict__ dq, int heads,
                                       float scale) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::kHeadDim;
  static_assert(sizeof(T) == 2 && D % 64 == 0, "16-bit; column chunks of 64");
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const int warp = blockIdx.y % 4;
  const long long row0 = static_cast<long long>(blockIdx.y / 4) * 64;
  const QkvIndex<Cfg> ix(b, h, heads, seq_q);
  const float* tile = dq_acc + (static_cast<long long>(blockIdx.x) * seq_q + row0) * D;
#pragma unroll
  for (int u = threadIdx.x; u < D / 64 * 128; u += 128) {  // (chunk, e, j, g), g fastest
    const int g = u % 8, j = u / 8 % 8, e = u / 64 % 2, chunk = u / 128;
    const float4* src = reinterpret_cast<const float4*>(tile + dq_fragment_offset(chunk, j, e, warp * 32 + 4 * g));
    const float4 a = src[0], c = src[1];  // columns 8j .. 8j + 7: lanes 4g .. 4g + 3, a pair each
    T* to = dq + ix.at(row0 + warp * 16 + g + 8 * e) + chunk * 64 + 8 * j;
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(to), "r"(pack_pair<T>(a.x * scale, a.y * scale)),
                 "r"(pack_pair<T>(a.z * scale, a.w * scale)), "r"(pack_pair<T>(c.x * scale, c.y * scale)),
                 "r"(pack_pair<T>(c.z * scale, c.w * scale)));
  }
}

}  // namespace kernels
}  // namespace bsjit
