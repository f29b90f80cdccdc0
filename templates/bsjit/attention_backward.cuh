// Block-sparse attention, fused backward (flash-style, mma.sync): dQ, dK and dV from Q, K, V, the
// forward's output O and log-sum-exp, and dO, over only the mask's blocks. Three kernels, run in
// order on one stream:
// - attention_backward_prep_kernel: Delta = rowsum(dO ∘ O) per query row; zeroes the fp32 dQ
//   accumulator.
// - attention_backward_kernel: one CTA per key tile of KT keys of one (batch, head), KT / 16 warps
//   of 16 keys each. It walks the query blocks whose row holds its key block (the mask's column,
//   from the generator's column LUT), QT queries at a time through a 2-stage cp.async pipeline of
//   Q and dO tiles, and computes in registers, rows being keys: Sᵀ = K·Qᵀ, Pᵀ = exp(scale·Sᵀ − lse),
//   dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − Delta), dK += dSᵀ·Q; dSᵀ goes through shared
//   memory for dQ = dS·K, added to the fp32 accumulator with atomics (other key tiles add theirs).
// - attention_backward_dq_kernel: the accumulator, scaled, to dQ in the tensors' order.
// Grouped-query attention (Cfg::kKvGroup > 1 query heads per key/value head): the main kernel adds
// each query head's dK and dV to fp32 accumulators of the group's key/value head instead of storing
// them (zeroed before it), and attention_backward_dkv_kernel writes them out, a fourth kernel.
#pragma once

#include "bsjit/attention.cuh"

namespace bsjit {
namespace kernels {

// The backward's mask tables (the generated Config's col_start(), query_blocks(), key_tile_order())
// read through the read-only data path, ld.global.nc. The tables are not const in the source (their
// values arrive after compiling: generator/device_tables.hpp), so plain indexing gives plain loads,
// which ptxas keeps in order with the dQ reductions beside them: that cost 5% at block 64, d = 64
// (suite A, 6.12 -> 6.42 ms; as constants in the source the tables were read with .nc). The asm
// is a barrier to NVVM's code motion, which the forward kernels need: their tables stay plain
// loads (through this, the forward lost 2% at block 128, d = 64; plainly read, nothing).
struct MaskTable {
  const int* p;
  __device__ __forceinline__ int operator[](long long i) const {
    int v;
    asm("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p + i));
    return v;
  }
};

template <class Cfg>
struct AttentionBackwardPlan {
  static constexpr int kS = Cfg::kHeadDim + kPad;  // K, V, Q and dO rows
  static constexpr int kSd = Cfg::kQTile + kPad;   // dSᵀ rows
  static constexpr int kSharedBytes = (2 * Cfg::kKTile + 2 * 2 * Cfg::kQTile) * kS * 2 + Cfg::kKTile * kSd * 2;
};

// grid (batch · heads, seq_q / 16), 128 threads: 16 query rows a CTA. Every access is 16 bytes
// and a warp's are consecutive: D / 8 threads read a row of O and of dO, 8 values each, and sum
// their products over the row by shuffles; the rows' 16 · D accumulator floats (contiguous, whatever
// order the main kernel adds in) are zeroed as 16-byte stores. Scalar 2-byte loads and 4-byte
// stores a row apart ran at 0.76 TB/s at d = 128 (0.71 ms of the causal b = 128 backward's 6.7 on an
// H100, 2026-12-07, docs/PERFORMANCE.md "The backward's memory-bound kernels").
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_backward_prep_kernel(const typename Cfg::T* __restrict__ out, const typename Cfg::T* __restrict__ dout,
                                   float* __restrict__ delta, float* __restrict__ dq_acc, int heads) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::kHeadDim, kLanes = D / 8, kRows = 128 / kLanes;  // threads a row, rows a pass
  static_assert(sizeof(T) == 2 && D % 8 == 0 && kLanes <= 32, "16-bit rows of 16-byte chunks, a row within a warp");
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const QkvIndex<Cfg> ix(b, h, heads, seq_q);
  const long long first = static_cast<long long>(blockIdx.x) * seq_q + static_cast<long long>(blockIdx.y) * 16;
  const int lane = threadIdx.x % kLanes;
#pragma unroll
  for (int r0 = 0; r0 < 16; r0 += kRows) {
    const int local = r0 + threadIdx.x / kLanes;
    if (kRows > 16 && local >= 16) break;  // head dim 32: whole warps past the CTA's rows
    const long long row = static_cast<long long>(blockIdx.y) * 16 + local;
    const uint4 o = *reinterpret_cast<const uint4*>(out + ix.at(row) + lane * 8);
    const uint4 d = *reinterpret_cast<const uint4*>(dout + ix.at(row) + lane * 8);
    const unsigned ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float o0, o1, d0, d1;
      unpack_pair<T>(ow[i], o0, o1);
      unpack_pair<T>(dw[i], d0, d1);
      sum = fmaf(o0, d0, fmaf(o1, d1, sum));
    }
#pragma unroll
    for (int m = 1; m < kLanes; m *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (lane == 0) delta[first + local] = sum;
  }
  float4* acc = reinterpret_cast<float4*>(dq_acc + first * D);
#pragma unroll
  for (int i = threadIdx.x; i < 16 * D / 4; i += 128) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// grid (batch · heads, seq_q / 16), 128 threads: dQ = scale · accumulator.
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_backward_dq_kernel(const float* __restrict__ dq_acc, typename Cfg::T* __restrict__ dq, int heads,
                                 float scale) {
  constexpr int D = Cfg::kHeadDim, kPer = D / 8;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const long long row = static_cast<long long>(blockIdx.y) * 16 + threadIdx.x / 8;
  const int part = threadIdx.x % 8;
  const QkvIndex<Cfg> ix(b, h, heads, seq_q);
  const float* src = dq_acc + (static_cast<long long>(blockIdx.x) * seq_q + row) * D + part * kPer;
#pragma unroll
  for (int i = 0; i < kPer; i += 2) store_pair(dq + ix.at(row) + part * kPer + i, src[i] * scale, src[i + 1] * scale, 0);
}

// The fp32 dK accumulator of grouped-query attention, [batch · heads / kKvGroup, seq_k, D], with
// dV's after it, in the workspace after the dQ accumulator and Delta (pairs = batch · heads rows of
// seq_q floats): the rows of (batch b, key/value head kv) from dk on, each dV element dv floats
// after its dK.
template <class Cfg>
struct KeyGradientRows {
  float* dk;
  long long dv;
  __device__ KeyGradientRows(const float* delta, int pairs, long long seq_q, long long seq_k, int b,
                             const KvHead<Cfg>& kv) {
    dk = const_cast<float*>(delta) + static_cast<long long>(pairs) * seq_q +
         (static_cast<long long>(b) * kv.heads + kv.head) * seq_k * Cfg::kHeadDim;
    dv = static_cast<long long>(pairs / Cfg::kKvGroup) * seq_k * Cfg::kHeadDim;
  }
};

// grid (batch · heads / kKvGroup, seq_k / 16), 128 threads, for kKvGroup > 1: dK and dV from their
// fp32 accumulators (KeyGradientRows), in K's order.
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_backward_dkv_kernel(const float* __restrict__ acc, typename Cfg::T* __restrict__ dk,
                                  typename Cfg::T* __restrict__ dv, int kv_heads) {
  constexpr int D = Cfg::kHeadDim, kPer = D / 8;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  const int b = blockIdx.x / kv_heads, h = blockIdx.x % kv_heads;
  const long long row = static_cast<long long>(blockIdx.y) * 16 + threadIdx.x / 8;
  const int part = threadIdx.x % 8;
  const QkvIndex<Cfg> ix(b, h, kv_heads, seq_k);
  const float* k_src = acc + (static_cast<long long>(blockIdx.x) * seq_k + row) * D + part * kPer;
  const float* v_src = k_src + static_cast<long long>(gridDim.x) * seq_k * D;
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    store_pair(dk + ix.at(row) + part * kPer + i, k_src[i], k_src[i + 1], 0);
    store_pair(dv + ix.at(row) + part * kPer + i, v_src[i], v_src[i + 1], 0);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kKTile * 2)
    attention_backward_kernel(const typename Cfg::T* __restrict__ q, const typename Cfg::T* __restrict__ k,
                              const typename Cfg::T* __restrict__ v, const typename Cfg::T* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              const unsigned char* __restrict__ key_padding, float* __restrict__ dq_acc,
                              typename Cfg::T* __restrict__ dk, typename Cfg::T* __restrict__ dv, int heads,
                              int band, float scale_log2, float scale) {
  using T = typename Cfg::T;
  using Plan = AttentionBackwardPlan<Cfg>;
  constexpr int D = Cfg::kHeadDim, QT = Cfg::kQTile, KT = Cfg::kKTile, S = Plan::kS, SD = Plan::kSd;
  constexpr int kThreads = KT * 2, kSubTiles = Cfg::kBlock / QT;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  static_assert(sizeof(T) == 2 && D % 16 == 0 && QT == KT && KT % 16 == 0 && Cfg::kBlock % KT == 0,
                "16-bit; query and key tiles alike, whole mma tiles dividing the block");
  static_assert(Plan::kSharedBytes == Cfg::kBackwardSharedBytes, "host and device disagree on shared memory");
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + KT * S;
  T* Qs = Vs + KT * S;       // [2][QT][S]
  T* Os = Qs + 2 * QT * S;   // dO, [2][QT][S]
  T* dSs = Os + 2 * QT * S;  // dSᵀ, [KT][SD]

  const BandedTile cta(static_cast<int>((seq_k + KT - 1) / KT), band);  // attention.cuh
  const int b = cta.bh / heads, h = cta.bh % heads;
  const long long bh = cta.bh;
  const long long k0 = static_cast<long long>(Cfg::key_tile_order()[cta.rank]) * KT;
  const int layout = Cfg::kLayouts == 1 ? 0 : h;
  const int col = static_cast<int>(k0 / Cfg::kBlock);
  const int begin = Cfg::col_start()[layout * Cfg::k_blocks() + col];
  const int total = (Cfg::col_start()[layout * Cfg::k_blocks() + col + 1] - begin) * kSubTiles;
  const KvHead<Cfg> kv(h, heads);
  const QkvIndex<Cfg> qi(b, h, heads, seq_q), ki(b, kv.head, kv.heads, seq_k);
  auto query0 = [&](int step) {
    return static_cast<long long>(Cfg::query_blocks()[begin + step / kSubTiles]) * Cfg::kBlock + (step % kSubTiles) * QT;
  };

  copy_tile_async<KT, D, S, kThreads>(Ks, [&](int r) { return k + ki.at(k0 + r); }, [](int) { return true; });
  copy_tile_async<KT, D, S, kThreads>(Vs, [&](int r) { return v + ki.at(k0 + r); }, [](int) { return true; });
  auto load = [&](int step) {
    const long long q0 = query0(step);
    copy_tile_async<QT, D, S, kThreads>(Qs + (step % 2) * QT * S, [&](int r) { return q + qi.at(q0 + r); },
                                        [](int) { return true; });
    copy_tile_async<QT, D, S, kThreads>(Os + (step % 2) * QT * S, [&](int r) { return dout + qi.at(q0 + r); },
                                        [](int) { return true; });
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4, quad = lane / 8,
            r8 = lane % 8;
  const long long my_key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  bool live[2] = {true, true};  // not a padded key
  if (key_padding != nullptr)
    for (int i = 0; i < 2; ++i) live[i] = key_padding[b * seq_k + my_key[i]] != 0;
  float dkacc[D / 8][4], dvacc[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dkacc[j][e] = dvacc[j][e] = 0.0f;
  constexpr float kLog2e = 1.4426950408889634f;

  run_pipeline<2>(total, load, [&](int step) {
    const T* qs = Qs + (step % 2) * QT * S;
    const T* os = Os + (step % 2) * QT * S;
    const long long q0 = query0(step);
    // Sᵀ = K·Qᵀ: this warp's 16 keys × QT queries (Q tiles are K-major B operands)
    float p[QT / 8][4];
#pragma unroll
    for (int j = 0; j < QT / 8; ++j) p[j][0] = p[j][1] = p[j][2] = p[j][3] = 0.0f;
    warp_mma_rows<T, QT, D, S>(p, Ks + warp * 16 * S, qs);
    // Pᵀ = exp2(scale_log2 · Sᵀ − lse · log2 e); 0 for masked pairs and rows with no key
    const bool causal_here = Cfg::kCausal && k0 + KT - 1 > q0;
#pragma unroll
    for (int j = 0; j < QT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long query = q0 + 8 * j + 2 * t4 + (e & 1);
        const float l = lse[bh * seq_q + query];
        const bool keep = live[e >> 1] && !(causal_here && my_key[e >> 1] > query) && l != minus_infinity();
        p[j][e] = keep ? fast_exp2(fmaf(p[j][e], scale_log2, -l * kLog2e)) : 0.0f;
      }
    // dV += Pᵀ·dO (dO MN-major)
#pragma unroll
    for (int c = 0; c < QT / 16; ++c) {
      unsigned pa[4];
      accumulator_fragment<T>(pa, p, c);
      warp_mma_mn_major<T, D, S>(dvacc, pa, os + c * 16 * S);
    }
    // dPᵀ = V·dOᵀ (dO K-major), then dSᵀ = Pᵀ ∘ (dPᵀ − Delta)
    float ds[QT / 8][4];
#pragma unroll
    for (int j = 0; j < QT / 8; ++j) ds[j][0] = ds[j][1] = ds[j][2] = ds[j][3] = 0.0f;
    warp_mma_rows<T, QT, D, S>(ds, Vs + warp * 16 * S, os);
#pragma unroll
    for (int j = 0; j < QT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[j][e] = p[j][e] * (ds[j][e] - delta[bh * seq_q + q0 + 8 * j + 2 * t4 + (e & 1)]);
    // dK += dSᵀ·Q (Q MN-major); dSᵀ to shared memory for dQ
#pragma unroll
    for (int c = 0; c < QT / 16; ++c) {
      unsigned da[4];
      accumulator_fragment<T>(da, ds, c);
      *reinterpret_cast<unsigned*>(dSs + (warp * 16 + g) * SD + 16 * c + 2 * t4) = da[0];
      *reinterpret_cast<unsigned*>(dSs + (warp * 16 + g + 8) * SD + 16 * c + 2 * t4) = da[1];
      *reinterpret_cast<unsigned*>(dSs + (warp * 16 + g) * SD + 16 * c + 8 + 2 * t4) = da[2];
      *reinterpret_cast<unsigned*>(dSs + (warp * 16 + g + 8) * SD + 16 * c + 8 + 2 * t4) = da[3];
      warp_mma_mn_major<T, D, S>(dkacc, da, qs + c * 16 * S);
    }
    __syncthreads();
    // dQ (this warp's 16 queries × D) = dS·K: dS read transposed from dSᵀ, K MN-major
    float dq[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < KT / 16; ++c) {
      unsigned a[4];
      ldmatrix_x4_trans(a, dSs + (c * 16 + r8 + (quad / 2) * 8) * SD + warp * 16 + (quad % 2) * 8);
      warp_mma_mn_major<T, D, S>(dq, a, Ks + c * 16 * S);
    }
    float* acc = dq_acc + (bh * seq_q + q0 + warp * 16 + g) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) atomicAdd(acc + (e >> 1) * 8 * D + 8 * j + 2 * t4 + (e & 1), dq[j][e]);
  });

  if constexpr (Cfg::kKvGroup == 1) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        store_pair(dk + ki.at(my_key[i]) + 8 * j + 2 * t4, dkacc[j][2 * i] * scale, dkacc[j][2 * i + 1] * scale, 0);
        store_pair(dv + ki.at(my_key[i]) + 8 * j + 2 * t4, dvacc[j][2 * i], dvacc[j][2 * i + 1], 0);
      }
  } else {  // the group's query heads add into the key/value head's accumulators
    const KeyGradientRows<Cfg> acc(delta, cta.pairs, seq_q, seq_k, b, kv);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float* at = acc.dk + my_key[i] * D + 8 * j + 2 * t4 + e;
          atomicAdd(at, dkacc[j][2 * i + e] * scale);
          atomicAdd(at + acc.dv, dvacc[j][2 * i + e]);
        }
  }
}

}  // namespace kernels
}  // namespace bsjit
