// Block-sparse attention, fused backward on Hopper (sm_90a): the main kernel of
// attention_backward.cuh's three (the prep and dQ-conversion kernels are the same), with warpgroup
// tensor cores fed by TMA.
//
// A CTA takes one key block (kKTile = 64 · consumers keys) of one (batch, head). Warpgroup 0 is
// the producer: one thread copies the K and V tiles once, then for each query tile of kQTile = 64
// rows in the block's column (the generator's column LUT) its Q and dO tiles and their
// log-sum-exp and Delta into a kStages-deep ring (full and empty mbarriers). Each consumer
// warpgroup owns 64 keys, rows of its products, and per query tile:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (operands in shared memory, K-major), issued together;
//   Pᵀ = exp2(scale_log2 · Sᵀ − lse · log2 e) in registers (masked pairs 0), dV += Pᵀ·dO (P from
//   registers, dO MN-major);
//   dSᵀ = Pᵀ ∘ (dPᵀ − Delta), dK += dSᵀ·Q, and dSᵀ to shared memory;
//   dQ = dS·K from shared memory (dSᵀ MN-major as A, K MN-major), added to the fp32 accumulator
//   with 8-byte reductions. With head dim 128 and two consumers both consumers' dSᵀ feed one
//   product over all the block's keys, each consumer taking 64 of dQ's columns (dSᵀ double
//   buffered, a named barrier between them); otherwise each consumer multiplies its own 64 keys.
#pragma once

#include "bsjit/attention_backward.cuh"
#include "bsjit/wgmma.cuh"

namespace bsjit {
namespace kernels {

template <class Cfg>
struct AttentionBackwardTmaPlan {
  static constexpr int kConsumers = Cfg::kKTile / 64;
  static constexpr bool kSharedDq = kConsumers == 2 && Cfg::kHeadDim == 128;
  static constexpr int kKVBytes = Cfg::kKTile * Cfg::kHeadDim * 2;  // K or V
  static constexpr int kQBytes = Cfg::kQTile * Cfg::kHeadDim * 2;   // Q or dO of one stage
  static constexpr int kDsBytes = Cfg::kKTile * Cfg::kQTile * 2;    // dSᵀ, one buffer
  static constexpr int kDsBuffers = kSharedDq ? 2 : 1;
  static constexpr int kRowBytes = Cfg::kQTile * 4;                  // lse or Delta of one stage
  static constexpr int kBarriers = 1 + 2 * Cfg::kStages;              // K and V; full, empty per stage
  // one consumer with head dim 64: two CTAs per SM (128 registers a thread at launch); with head
  // dim 128 its dK and dV accumulators alone take 128 registers a thread, so one CTA
  static constexpr int kCtasPerSm = kConsumers == 1 && Cfg::kHeadDim == 64 ? 2 : 1;
  static constexpr int kSharedBytes = 2 * kKVBytes + Cfg::kStages * (2 * kQBytes + 2 * kRowBytes) +
                                      kDsBuffers * kDsBytes + kBarriers * 8 + kSwizzleAtomBytes;
};

template <class Cfg>
__global__ void __launch_bounds__((Cfg::kKTile / 64 + 1) * 128, AttentionBackwardTmaPlan<Cfg>::kCtasPerSm)
    attention_backward_tma_kernel(const float* __restrict__ lse, const float* __restrict__ delta,
                                  const unsigned char* __restrict__ key_padding, float* __restrict__ dq_acc,
                                  typename Cfg::T* __restrict__ dk, typename Cfg::T* __restrict__ dv, int heads,
                                  float scale_log2, float scale, const __grid_constant__ TensorMap map_q,
                                  const __grid_constant__ TensorMap map_k, const __grid_constant__ TensorMap map_v,
                                  const __grid_constant__ TensorMap map_do) {
  using T = typename Cfg::T;
  using Plan = AttentionBackwardTmaPlan<Cfg>;
  constexpr int D = Cfg::kHeadDim, QT = Cfg::kQTile, KT = Cfg::kKTile, S = Cfg::kStages, kPanels = D / 64;
  constexpr int kConsumers = Plan::kConsumers, kSub = Cfg::kBlock / QT;
  constexpr int kSeqQ = Cfg::kQBlocks * Cfg::kBlock, kSeqK = Cfg::kKBlocks * Cfg::kBlock;
  static_assert(sizeof(T) == 2 && (D == 64 || D == 128) && QT == 64 && KT == Cfg::kBlock && (KT == 64 || KT == 128) &&
                    S >= 2,
                "16-bit; head dim 64 or 128; query tiles of 64; one key block per CTA, 64 keys per consumer");
  static_assert(Plan::kSharedBytes == Cfg::kBackwardSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_address(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                    (kSwizzleAtomBytes - 1));
  unsigned char* ks = smem;
  unsigned char* vs = ks + Plan::kKVBytes;
  auto qs = [&](int stage) { return vs + Plan::kKVBytes + stage * Plan::kQBytes; };
  auto dos = [&](int stage) { return vs + Plan::kKVBytes + (S + stage) * Plan::kQBytes; };
  unsigned char* dss = vs + Plan::kKVBytes + 2 * S * Plan::kQBytes;
  float* lse_s = reinterpret_cast<float*>(dss + Plan::kDsBuffers * Plan::kDsBytes);  // [S][QT]
  float* delta_s = lse_s + S * QT;
  unsigned long long* kv_full = reinterpret_cast<unsigned long long*>(delta_s + S * QT);
  unsigned long long* full = kv_full + 1;
  unsigned long long* empty = full + S;

  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const long long bh = blockIdx.x;
  const int k0 = Cfg::key_tile_order()[blockIdx.y] * KT, col = k0 / Cfg::kBlock;
  const int layout = Cfg::kLayouts == 1 ? 0 : h;
  const int begin = Cfg::col_start()[layout * Cfg::kKBlocks + col];
  const int total = (Cfg::col_start()[layout * Cfg::kKBlocks + col + 1] - begin) * kSub;
  auto query0 = [&](int step) { return Cfg::query_blocks()[begin + step / kSub] * Cfg::kBlock + (step % kSub) * QT; };
  if (threadIdx.x == 0) {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < S; ++s) mbarrier_init(&full[s], 1), mbarrier_init(&empty[s], kConsumers * 128);
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {  // producer
    warpgroup_release_registers<24>();
    if (threadIdx.x != 0) return;
    auto load = [&](unsigned char* dst, const TensorMap& map, int seq, int p, int rows, unsigned long long* bar) {
#pragma unroll
      for (int j = 0; j < kPanels; ++j) {
        if (Cfg::kHeadsFirst) tma_load_3d(dst + j * rows * kSwizzleRowBytes, map, 64 * j, p, b * heads + h, bar);
        else tma_load_3d(dst + j * rows * kSwizzleRowBytes, map, 64 * j, h, b * seq + p, bar);
      }
    };
    mbarrier_arrive_expect_tx(kv_full, 2 * Plan::kKVBytes);
    load(ks, map_k, kSeqK, k0, KT, kv_full);
    load(vs, map_v, kSeqK, k0, KT, kv_full);
    for (int i = 0; i < total; ++i) {
      const int s = i % S, q0 = query0(i);
      if (i >= S) mbarrier_wait(&empty[s], (i / S - 1) & 1);
      mbarrier_arrive_expect_tx(&full[s], 2 * Plan::kQBytes + 2 * Plan::kRowBytes);
      load(qs(s), map_q, kSeqQ, q0, QT, &full[s]);
      load(dos(s), map_do, kSeqQ, q0, QT, &full[s]);
      bulk_load(lse_s + s * QT, lse + bh * kSeqQ + q0, Plan::kRowBytes, &full[s]);
      bulk_load(delta_s + s * QT, delta + bh * kSeqQ + q0, Plan::kRowBytes, &full[s]);
    }
    return;
  }
  warpgroup_claim_registers<Plan::kCtasPerSm == 2 ? 232 : 240>();

  const int consumer = warpgroup - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, g = lane / 4,
            t4 = lane % 4;
  const int row0 = consumer * 64;  // this consumer's keys within the block
  const int my_key[2] = {k0 + row0 + warp * 16 + g, k0 + row0 + warp * 16 + g + 8};
  bool live[2] = {true, true};
  if (key_padding != nullptr)
    for (int r = 0; r < 2; ++r) live[r] = key_padding[static_cast<long long>(b) * kSeqK + my_key[r]] != 0;
  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
  const unsigned char* ka = ks + row0 * kSwizzleRowBytes;
  const unsigned char* va = vs + row0 * kSwizzleRowBytes;
  constexpr float kLog2e = 1.4426950408889634f;
  // dQ: columns and keys this consumer multiplies (see the top)
  constexpr int kDqCols = Plan::kSharedDq ? 64 : D, kDqKeys = Plan::kSharedDq ? KT : 64;
  const int dq_col0 = Plan::kSharedDq ? consumer * 64 : 0, dq_key0 = Plan::kSharedDq ? 0 : row0;

  mbarrier_wait(kv_full, 0);
  for (int i = 0; i < total; ++i) {
    const int s = i % S, q0 = query0(i);
    mbarrier_wait(&full[s], (i / S) & 1);
    float st[QT / 2], dpt[QT / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_m64k16<T, QT, 0, 0>(
          st, smem_descriptor(ka + (kk / 4) * KT * kSwizzleRowBytes + (kk % 4) * 32, 16, kSwizzleAtomBytes),
          smem_descriptor(qs(s) + (kk / 4) * QT * kSwizzleRowBytes + (kk % 4) * 32, 16, kSwizzleAtomBytes), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_m64k16<T, QT, 0, 0>(
          dpt, smem_descriptor(va + (kk / 4) * KT * kSwizzleRowBytes + (kk % 4) * 32, 16, kSwizzleAtomBytes),
          smem_descriptor(dos(s) + (kk / 4) * QT * kSwizzleRowBytes + (kk % 4) * 32, 16, kSwizzleAtomBytes), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_registers(st);

    // Pᵀ: rows are this thread's keys, columns 8j + 2·t4 (+1) the tile's queries
    const float* ls = lse_s + s * QT;
    const bool causal_here = Cfg::kCausal && k0 + row0 + 63 > q0;
#pragma unroll
    for (int j = 0; j < QT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query = 8 * j + 2 * t4 + (e & 1);
        const float l = ls[query];
        const float lg = l == minus_infinity() ? -minus_infinity() : l * kLog2e;  // no key: P = 0
        const bool keep = live[e >> 1] && !(causal_here && my_key[e >> 1] > q0 + query);
        st[4 * j + e] = keep ? fast_exp2(fmaf(st[4 * j + e], scale_log2, -lg)) : 0.0f;
      }
    unsigned pa[QT / 16][4];
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[c][r] = pack_pair<T>(st[8 * c + 2 * r], st[8 * c + 2 * r + 1]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
      wgmma_m64k16_rs<T, D, 1>(dv_acc, pa[c],
                               smem_descriptor(dos(s) + c * 16 * kSwizzleRowBytes, QT * kSwizzleRowBytes,
                                               kSwizzleAtomBytes));
    wgmma_commit();
    wgmma_wait<1>();  // dPᵀ (the dV product may still run)
    wgmma_fence_registers(dpt);

    // dSᵀ = Pᵀ ∘ (dPᵀ − Delta), as A fragments and into shared memory (row = key, column = query)
    const float* dl = delta_s + s * QT;
    unsigned char* ds_tile = dss + (Plan::kSharedDq ? (i % 2) * Plan::kDsBytes : 0);
    unsigned da[QT / 16][4];
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = 2 * c + (r >> 1), e0 = 4 * j + 2 * (r & 1), query = 8 * j + 2 * t4;
        da[c][r] = pack_pair<T>(st[e0] * (dpt[e0] - dl[query]), st[e0 + 1] * (dpt[e0 + 1] - dl[query + 1]));
        const int key_row = row0 + warp * 16 + g + 8 * (r & 1);
        *reinterpret_cast<unsigned*>(ds_tile + swizzled_offset(key_row, j) + 4 * t4) = da[c][r];
      }
    fence_proxy_async();
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < QT / 16; ++c)
      wgmma_m64k16_rs<T, D, 1>(dk_acc, da[c],
                               smem_descriptor(qs(s) + c * 16 * kSwizzleRowBytes, QT * kSwizzleRowBytes,
                                               kSwizzleAtomBytes));
    wgmma_commit();
    // every writer of the dSᵀ rows this product reads is done
    if constexpr (Plan::kSharedDq) named_barrier_sync(1, 256);
    else named_barrier_sync(1 + consumer, 128);
    float dq[kDqCols / 2];
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kDqKeys / 16; ++c)
      wgmma_m64k16<T, kDqCols, 1, 1>(
          dq, smem_descriptor(ds_tile + (dq_key0 + c * 16) * kSwizzleRowBytes, KT * kSwizzleRowBytes, kSwizzleAtomBytes),
          smem_descriptor(ks + (dq_col0 / 64) * KT * kSwizzleRowBytes + (dq_key0 + c * 16) * kSwizzleRowBytes,
                          KT * kSwizzleRowBytes, kSwizzleAtomBytes),
          c > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_registers(dq);
    wgmma_fence_registers(dk_acc);
    wgmma_fence_registers(dv_acc);
    wgmma_fence_registers(pa);
    wgmma_fence_registers(da);
    mbarrier_arrive(&empty[s]);
    float* acc = dq_acc + (bh * kSeqQ + q0) * D + dq_col0;
#pragma unroll
    for (int j = 0; j < kDqCols / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        red_add_pair(acc + (warp * 16 + g + 8 * r) * D + 8 * j + 2 * t4, dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
  }

  const QkvIndex<Cfg> ki(b, h, heads, kSeqK);
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      store_pair(dk + ki.at(my_key[r]) + 8 * j + 2 * t4, dk_acc[4 * j + 2 * r] * scale, dk_acc[4 * j + 2 * r + 1] * scale,
                 0);
      store_pair(dv + ki.at(my_key[r]) + 8 * j + 2 * t4, dv_acc[4 * j + 2 * r], dv_acc[4 * j + 2 * r + 1], 0);
    }
}

}  // namespace kernels
}  // namespace bsjit
