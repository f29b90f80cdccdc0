// Block-sparse attention, fused forward on Hopper (sm_90a): the same computation as
// attention_forward_kernel (attention.cuh), with warpgroup tensor cores fed by TMA.
//
// A CTA takes one query block (kQTile = 64 · kConsumers rows) of one (batch, head). Warpgroup 0 is
// the producer: one thread copies the Q tile once, then the K and V tiles of each key block of the
// row's LUT into a kStages-deep ring, with full and empty mbarriers for K and V apart (K of a
// stage is released as soon as its scores are in). Each consumer warpgroup owns 64 query rows and
// runs a software pipeline: S = Q·Kᵀ of step i (both operands in shared memory, K-major) and
// O += P·V of step i - 1 (P straight from registers as wgmma's A operand, V MN-major) are issued
// together, and the softmax of step i (log2 domain) runs while the product is in the tensor cores.
// Tiles are 128-byte swizzled: head dims of 64 or 128 as one or two panels of 64 columns.
#pragma once

#include "bsjit/attention.cuh"
#include "bsjit/wgmma.cuh"

namespace bsjit {
namespace kernels {

// TMA copy of `rows` positions from p on of (batch b, head h) of a Q- or K-shaped tensor (3-D maps:
// (d, heads, batch · seq) for [batch, seq, heads, d], (d, seq, batch · heads) for [batch, heads,
// seq, d]) into dst, panel by panel of 64 head-dim columns, panels stride_rows rows apart.
template <class Cfg>
__device__ __forceinline__ void tma_load_rows(unsigned char* dst, const TensorMap& map, int b, int h, int heads,
                                              int seq, int p, int stride_rows, unsigned long long* bar) {
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDim / 64; ++j) {
    unsigned char* to = dst + j * stride_rows * kSwizzleRowBytes;
    if (Cfg::kHeadsFirst) tma_load_3d(to, map, 64 * j, p, b * heads + h, bar);
    else tma_load_3d(to, map, 64 * j, h, b * seq + p, bar);
  }
}

template <class Cfg>
struct AttentionTmaPlan {
  static constexpr int kQBytes = Cfg::kQTile * Cfg::kHeadDim * 2;
  static constexpr int kKVBytes = Cfg::kKTile * Cfg::kHeadDim * 2;  // one K or V tile
  static constexpr int kBarriers = 1 + 4 * Cfg::kStages;             // Q; K, V full; K, V empty
  static constexpr int kSharedBytes = kQBytes + 2 * Cfg::kStages * kKVBytes + kBarriers * 8 + kSwizzleAtomBytes;
};

template <class Cfg>
__global__ void __launch_bounds__((Cfg::kConsumers + 1) * 128, Cfg::kConsumers == 1 ? 2 : 1)
    attention_forward_tma_kernel(typename Cfg::T* __restrict__ out, float* __restrict__ lse,
                                 const unsigned char* __restrict__ key_padding, int heads, int band,
                                 float scale_log2, const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                                 const __grid_constant__ TensorMap map_v) {
  using T = typename Cfg::T;
  using Plan = AttentionTmaPlan<Cfg>;
  constexpr int D = Cfg::kHeadDim, QT = Cfg::kQTile, KT = Cfg::kKTile, S = Cfg::kStages;
  constexpr int kConsumerThreads = Cfg::kConsumers * 128;
  const int seq_q = Cfg::q_blocks() * Cfg::kBlock, seq_k = Cfg::k_blocks() * Cfg::kBlock;
  static_assert(sizeof(T) == 2 && (D == 64 || D == 128) && (KT == 64 || KT == 128) && KT == Cfg::kBlock &&
                    QT == 64 * Cfg::kConsumers && Cfg::kBlock % QT == 0 && S >= 2,
                "16-bit; head dim 64 or 128; one key block per stage; consumers of 64 query rows");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = swizzle_aligned(smem_raw);
  unsigned char* qs = smem;
  auto ks = [&](int stage) { return smem + Plan::kQBytes + stage * Plan::kKVBytes; };
  auto vs = [&](int stage) { return smem + Plan::kQBytes + (S + stage) * Plan::kKVBytes; };
  unsigned long long* q_full = reinterpret_cast<unsigned long long*>(smem + Plan::kQBytes + 2 * S * Plan::kKVBytes);
  unsigned long long* k_full = q_full + 1;
  unsigned long long* v_full = k_full + S;
  unsigned long long* k_empty = v_full + S;
  unsigned long long* v_empty = k_empty + S;

  const BandedTile cta(seq_q / QT, band);  // attention.cuh
  const int b = cta.bh / heads, h = cta.bh % heads;
  const int q0 = Cfg::tile_order()[cta.rank] * QT, row = q0 / Cfg::kBlock;
  const int layout = Cfg::kLayouts == 1 ? 0 : h;
  const int begin = Cfg::row_start()[layout * Cfg::q_blocks() + row];
  const int total = Cfg::row_start()[layout * Cfg::q_blocks() + row + 1] - begin;
  // the row's key blocks, the table's address read once: read in each step, it cost 2% at b = 128
  // (the constant-memory pointer is reloaded after every asm statement that clobbers memory)
  const int* const keys = Cfg::keys() + begin;
  const int* quadrants = nullptr;  // the entries' live 64-blocks (a block-64 mask on tiles of 128)
  if constexpr (Quadrants<Cfg>::kOn) quadrants = Cfg::key_quadrants() + begin;
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < S; ++s) mbarrier_init(&k_full[s], 1), mbarrier_init(&v_full[s], 1);
    for (int s = 0; s < S; ++s) mbarrier_init(&k_empty[s], kConsumerThreads), mbarrier_init(&v_empty[s], kConsumerThreads);
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {  // producer
    warpgroup_release_registers<24>();
    if (threadIdx.x != 0) return;
    const KvHead<Cfg> kv(h, heads);  // K and V: maps over heads / kKvGroup heads
    auto load = [&](unsigned char* dst, const TensorMap& map, int seq, int p, int rows, unsigned long long* bar) {
      tma_load_rows<Cfg>(dst, map, b, kv.head, kv.heads, seq, p, rows, bar);
    };
    mbarrier_arrive_expect_tx(q_full, Plan::kQBytes);
    tma_load_rows<Cfg>(qs, map_q, b, h, heads, seq_q, q0, QT, q_full);
    for (int i = 0; i < total; ++i) {
      const int s = i % S, key0 = keys[i] * KT;
      if (i >= S) mbarrier_wait(&k_empty[s], (i / S - 1) & 1);
      mbarrier_arrive_expect_tx(&k_full[s], Plan::kKVBytes);
      load(ks(s), map_k, seq_k, key0, KT, &k_full[s]);
      if (i >= S) mbarrier_wait(&v_empty[s], (i / S - 1) & 1);
      mbarrier_arrive_expect_tx(&v_full[s], Plan::kKVBytes);
      load(vs(s), map_v, seq_k, key0, KT, &v_full[s]);
    }
    return;
  }
  // what the producer gave back: 2 consumers take 240 (one CTA per SM), 1 consumer 232 (two CTAs
  // of 256 threads, launched at 128 registers each)
  warpgroup_claim_registers<Cfg::kConsumers == 1 ? 232 : 240>();

  const int consumer = warpgroup - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, g = lane / 4,
            t4 = lane % 4;
  // this thread's accumulator rows (wgmma_epilogue's layout): g and g + 8 of its warp's 16
  const int my_row[2] = {q0 + consumer * 64 + warp * 16 + g, q0 + consumer * 64 + warp * 16 + g + 8};
  float o[D / 2], sc[KT / 2];
  unsigned pa[KT / 16][4];  // P of the previous step as A fragments
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f}, corr[2];
  const unsigned char* qa = qs + consumer * 64 * kSwizzleRowBytes;

  // S = Q·Kᵀ of step i, issued (not waited for)
  auto issue_scores = [&](int i) {
    const int s = i % S;
    mbarrier_wait(&k_full[s], (i / S) & 1);
    wgmma_fence();
    wgmma_k_major_tiles<T, KT, D>(sc, qa, QT, ks(s), KT, true);  // overwrites the last step's scores
    wgmma_commit();
  };
  // O += P·V of step i, issued
  auto issue_values = [&](int i) {
    const int s = i % S;
    mbarrier_wait(&v_full[s], (i / S) & 1);
    wgmma_fence();
    wgmma_registers_mn_major_tile<T, D, KT>(o, pa, vs(s), KT);
    wgmma_commit();
  };
  // Step i's scores (landed in sc) to probabilities in sc, in the log2 domain: masked keys (after
  // the query, only where the key block reaches past the tile's first row; padded keys; the dead
  // quadrants of a tile of 128) set to -inf, the running max and sum updated, corr = the factor the
  // output so far must take. The scale folds into one FFMA per score: max(scale · s) = scale ·
  // max(s) for scale > 0.
  auto softmax = [&](int i) {
    const int key0 = keys[i] * KT;
    int live = 3;  // this consumer's quadrants of the tile: key halves 0 and 1
    if constexpr (Quadrants<Cfg>::kOn) live = quadrants[i] >> (2 * (((q0 + consumer * 64) / 64) & 1)) & 3;
    if ((Cfg::kCausal && key0 + KT - 1 > q0 + consumer * 64) || key_padding != nullptr || live != 3) {
#pragma unroll
      for (int j = 0; j < KT / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * j + 2 * t4 + (e & 1);
          bool keep = !(Cfg::kCausal && key > my_row[e >> 1]);
          if constexpr (Quadrants<Cfg>::kOn) keep = keep && (live >> (8 * j >= 64)) & 1;
          if (key_padding != nullptr) keep = keep && key_padding[static_cast<long long>(b) * seq_k + key] != 0;
          if (!keep) sc[4 * j + e] = minus_infinity();
        }
    }
    float tile_max[2] = {minus_infinity(), minus_infinity()}, m_use[2];
#pragma unroll
    for (int j = 0; j < KT / 2; ++j) tile_max[(j >> 1) & 1] = fmaxf(tile_max[(j >> 1) & 1], sc[j]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r] * scale_log2);
      m_use[r] = m_new == minus_infinity() ? 0.0f : m_new;  // a row with no key yet: every p is 0
      corr[r] = fast_exp2(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < KT / 2; ++j) {
      const int r = (j >> 1) & 1;
      sc[j] = fast_exp2(fmaf(sc[j], scale_log2, -m_use[r]));
      l[r] += sc[j];
    }
  };
  // the accumulator layout of S is the A-fragment layout of P: n8 tiles 2c and 2c + 1 make k16 step c
  auto pack_probabilities = [&] {
#pragma unroll
    for (int c = 0; c < KT / 16; ++c)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[c][r] = pack_pair<T>(sc[8 * c + 2 * r], sc[8 * c + 2 * r + 1]);
  };

  // Two consumers take turns at the tensor cores (named barriers 2 and 3, consumer 0 first): one
  // issues its products while the other computes a softmax, so the exponentials of one hide
  // behind the matrix products of the other.
  auto my_turn = [&] {
    if constexpr (Cfg::kConsumers == 2) named_barrier_sync(2 + consumer, 256);
  };
  auto their_turn = [&] {
    if constexpr (Cfg::kConsumers == 2) named_barrier_arrive(3 - consumer, 256);
  };
  if (consumer == 1) their_turn();

  // Software pipeline: step i's Q·Kᵀ and step i - 1's P·V run on the tensor cores while this
  // warpgroup computes step i's softmax; K of a stage is released once its scores are in, V once
  // its product is.
  mbarrier_wait(q_full, 0);
  if (total > 0) {
    my_turn();
    issue_scores(0);
    their_turn();
    wgmma_wait<0>();
    wgmma_fence_registers(sc);
    mbarrier_arrive(&k_empty[0]);
    softmax(0);
    pack_probabilities();
  }
  for (int i = 1; i < total; ++i) {
    my_turn();
    issue_scores(i);
    issue_values(i - 1);
    their_turn();
    wgmma_wait<1>();  // the scores (committed first)
    wgmma_fence_registers(sc);
    mbarrier_arrive(&k_empty[i % S]);
    softmax(i);
    wgmma_wait<0>();  // the product, which read pa and accumulated into o
    wgmma_fence_registers(o);
    wgmma_fence_registers(pa);
    mbarrier_arrive(&v_empty[(i - 1) % S]);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0], o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
    pack_probabilities();
  }
  if (total > 0) {
    my_turn();
    issue_values(total - 1);
    their_turn();
    wgmma_wait<0>();
    wgmma_fence_registers(o);
    wgmma_fence_registers(pa);
    mbarrier_arrive(&v_empty[(total - 1) % S]);
  }
  if (consumer == 0) my_turn();  // consumer 1's last hand-over: every barrier phase completes

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
  const long long stride = Cfg::kHeadsFirst ? D : static_cast<long long>(heads) * D;
  const long long base = Cfg::kHeadsFirst ? (static_cast<long long>(b) * heads + h) * seq_q * D
                                          : static_cast<long long>(b) * seq_q * heads * D + static_cast<long long>(h) * D;
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      store_pair(out + base + my_row[r] * stride + j * 8 + 2 * t4, o[4 * j + 2 * r] * inv[r],
                 o[4 * j + 2 * r + 1] * inv[r], 0);
  if (t4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      lse[(static_cast<long long>(b) * heads + h) * seq_q + my_row[r]] =
          l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : minus_infinity();
  }
}

}  // namespace kernels
}  // namespace bsjit
