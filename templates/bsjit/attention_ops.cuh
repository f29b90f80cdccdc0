// Block-sparse attention, decomposed: the ops of blocksparse's BlocksparseTransformer over only the
// masks' nonzero blocks, with their gradients.
// - attention_scores_kernel (nt): S = A·Bᵀ on every nonzero block (Q·Kᵀ; dP = dO·Vᵀ).
// - attention_softmax_kernel: P = softmax(scale · S) over each query row's blocks, with causal,
//   key-padding and element masks (masked entries and rows with no key: 0).
// - attention_softmax_grad_kernel: dS = scale · P ∘ (dP − rowsum(dP ∘ P)).
// - attention_probs_v_kernel (nn): O = P·V (dQ = dS·K).
// - attention_probs_t_kernel (tn): Y = Pᵀ·X (dV = Pᵀ·dO, dK = dSᵀ·Q).
// A block-sparse tensor holds [batch, heads, blocks of the head's mask, block, block] values: the
// head's nonzero blocks in its mask's row-major order, each block row-major (query, key). The
// products take tiles of kTile = min(block, 64) rows, kTile / 16 warps of 16 rows each, mma.sync
// with fp32 accumulation; the softmax kernels one warp per query row. Grouped-query attention
// (Cfg::kKvGroup > 1 query heads per key/value head): the K-shaped tensors have heads / kKvGroup
// heads, and probs_t sums over each group's query heads.
#pragma once

#include "bsjit/attention.cuh"

namespace bsjit {
namespace kernels {

// A (batch, head)'s slice of a block-sparse tensor: its first block, and the table position of its
// mask's first block (Cfg's row-major tables cover every mask, one after the other).
template <class Cfg>
struct SparseSlice {
  long long base;  // in blocks
  int first, count;
  __device__ SparseSlice(int b, int h, int heads) {
    const int layout = Cfg::kLayouts == 1 ? 0 : h;
    first = Cfg::row_start()[layout * Cfg::q_blocks()];
    count = Cfg::row_start()[(layout + 1) * Cfg::q_blocks()] - first;
    const long long per_batch = Cfg::kLayouts == 1 ? static_cast<long long>(heads) * count : Cfg::mask_blocks();
    base = b * per_batch + (Cfg::kLayouts == 1 ? static_cast<long long>(h) * count : first);
  }
  // Element offset of row `row` of the block at table position pos.
  __device__ long long row(int pos, int row) const { return ((base + pos - first) * Cfg::kBlock + row) * Cfg::kBlock; }
};

template <class Cfg>
struct OpsPlan {
  static constexpr int kTile = Cfg::kTile, kThreads = kTile * 2, kS = Cfg::kHeadDim + kPad, kSp = kTile + kPad;
  static constexpr int kScoresShared = 2 * kTile * kS * 2;                   // A and B tiles
  static constexpr int kProductShared = 2 * (kTile * kSp + kTile * kS) * 2;  // 2 stages of P and V (or X)
};

// grid (batch · heads, most blocks of a mask × (block / kTile)²): one kTile × kTile tile of a block.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kTile * 2)
    attention_scores_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ bt,
                            typename Cfg::T* __restrict__ out, int heads) {
  using T = typename Cfg::T;
  using Plan = OpsPlan<Cfg>;
  constexpr int TL = Plan::kTile, D = Cfg::kHeadDim, S = Plan::kS, kSub = Cfg::kBlock / TL;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  extern __shared__ __align__(128) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + TL * S;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads;
  const SparseSlice<Cfg> slice(b, h, heads);
  const int i = blockIdx.y / (kSub * kSub), sub = blockIdx.y % (kSub * kSub);
  if (i >= slice.count) return;  // a head whose mask has fewer blocks
  const int pos = slice.first + i, r0 = (sub / kSub) * TL, c0 = (sub % kSub) * TL;
  const long long q0 = static_cast<long long>(Cfg::block_rows()[pos]) * Cfg::kBlock + r0;
  const long long k0 = static_cast<long long>(Cfg::keys()[pos]) * Cfg::kBlock + c0;
  const KvHead<Cfg> kv(h, heads);
  const QkvIndex<Cfg> ai(b, h, heads, seq_q), bi(b, kv.head, kv.heads, seq_k);
  copy_tile_async<TL, D, S, Plan::kThreads>(
      As, [&](int r) { return a + ai.at(q0 + r); }, [](int) { return true; });
  copy_tile_async<TL, D, S, Plan::kThreads>(
      Bs, [&](int r) { return bt + bi.at(k0 + r); }, [](int) { return true; });
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  float acc[TL / 8][4];
#pragma unroll
  for (int j = 0; j < TL / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  warp_mma_rows<T, TL, D, S>(acc, As + warp * 16 * S, Bs);
  T* o = out + slice.row(pos, r0 + warp * 16 + g) + c0;
#pragma unroll
  for (int j = 0; j < TL / 8; ++j) {
    store_pair(o + 8 * j + 2 * t4, acc[j][0], acc[j][1], 0);
    store_pair(o + 8 * Cfg::kBlock + 8 * j + 2 * t4, acc[j][2], acc[j][3], 0);
  }
}

// One query row of a (batch, head) in a softmax kernel: its mask row's blocks [begin, end) of the
// tables, and whether the row may attend a key (causal, key padding, element masks).
template <class Cfg>
struct SoftmaxRow {
  SparseSlice<Cfg> slice;
  long long query;
  int begin, end, in_block, b;
  const unsigned char* key_padding;
  const int* mask_slot;
  const unsigned* mask_bits;
  __device__ SoftmaxRow(int b_, int h, int heads, long long query_, const unsigned char* padding, const int* slot,
                        const unsigned* bits)
      : slice(b_, h, heads), query(query_), b(b_), key_padding(padding), mask_slot(slot), mask_bits(bits) {
    const int layout = Cfg::kLayouts == 1 ? 0 : h, block_row = static_cast<int>(query / Cfg::kBlock);
    begin = Cfg::row_start()[layout * Cfg::q_blocks() + block_row];
    end = Cfg::row_start()[layout * Cfg::q_blocks() + block_row + 1];
    in_block = static_cast<int>(query % Cfg::kBlock);
  }
  __device__ long long offset(int pos) const { return slice.row(pos, in_block); }
  __device__ bool keeps(int pos, int c) const {
    const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
    const long long key = static_cast<long long>(Cfg::keys()[pos]) * Cfg::kBlock + c;
    if (Cfg::kCausal && key > query) return false;
    if (key_padding != nullptr && key_padding[b * seq_k + key] == 0) return false;
    if (mask_slot != nullptr) {
      const int s = mask_slot[pos];
      if (s >= 0) {
        const long long bit = static_cast<long long>(s) * Cfg::kBlock * Cfg::kBlock + in_block * Cfg::kBlock + c;
        return (mask_bits[bit / 32] >> (bit % 32)) & 1u;
      }
    }
    return true;
  }
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// grid (batch · heads, seq_q / 4), 128 threads: a warp per query row. mask_slot: null (no element
// masks) or per table position the block's slot in mask_bits (-1: all kept).
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_softmax_kernel(const typename Cfg::T* __restrict__ scores, typename Cfg::T* __restrict__ probs,
                             const unsigned char* __restrict__ key_padding, const int* __restrict__ mask_slot,
                             const unsigned* __restrict__ mask_bits, int heads, float scale_log2) {
  const int b = blockIdx.x / heads, h = blockIdx.x % heads, lane = threadIdx.x % 32;
  const SoftmaxRow<Cfg> row(b, h, heads, static_cast<long long>(blockIdx.y) * 4 + threadIdx.x / 32, key_padding,
                            mask_slot, mask_bits);
  // running max and sum of this lane's kept entries (log2 domain), then across the warp
  float m = minus_infinity(), l = 0.0f;
  for (int pos = row.begin; pos < row.end; ++pos)
    for (int c = lane; c < Cfg::kBlock; c += 32) {
      if (!row.keeps(pos, c)) continue;
      const float x = to_float(scores[row.offset(pos) + c]) * scale_log2;
      const float m_new = fmaxf(m, x);
      l = l * exp2f(m - m_new) + exp2f(x - m_new);
      m = m_new;
    }
  float row_max = m;
#pragma unroll
  for (int s = 16; s > 0; s /= 2) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, s));
  const float sum = warp_sum(m == minus_infinity() ? 0.0f : l * exp2f(m - row_max));
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int pos = row.begin; pos < row.end; ++pos)
    for (int c = lane; c < Cfg::kBlock; c += 32) {
      const long long at = row.offset(pos) + c;
      const float p = row.keeps(pos, c) ? exp2f(to_float(scores[at]) * scale_log2 - row_max) * inv : 0.0f;
      probs[at] = from_float<typename Cfg::T>(p);
    }
}

// grid and threads as the softmax: dS = scale · P ∘ (dP − Σ dP ∘ P) over the row's blocks.
template <class Cfg>
__global__ void __launch_bounds__(128)
    attention_softmax_grad_kernel(const typename Cfg::T* __restrict__ probs, const typename Cfg::T* __restrict__ dprobs,
                                  typename Cfg::T* __restrict__ dscores, int heads, float scale) {
  const int b = blockIdx.x / heads, h = blockIdx.x % heads, lane = threadIdx.x % 32;
  const SoftmaxRow<Cfg> row(b, h, heads, static_cast<long long>(blockIdx.y) * 4 + threadIdx.x / 32, nullptr, nullptr,
                            nullptr);
  float dot = 0.0f;
  for (int pos = row.begin; pos < row.end; ++pos)
    for (int c = lane; c < Cfg::kBlock; c += 32) {
      const long long at = row.offset(pos) + c;
      dot += to_float(probs[at]) * to_float(dprobs[at]);
    }
  dot = warp_sum(dot);
  for (int pos = row.begin; pos < row.end; ++pos)
    for (int c = lane; c < Cfg::kBlock; c += 32) {
      const long long at = row.offset(pos) + c;
      dscores[at] = from_float<typename Cfg::T>(scale * to_float(probs[at]) * (to_float(dprobs[at]) - dot));
    }
}

// The products with a block-sparse operand: acc (this warp's 16 output rows × D) summed over
// `total` steps of kTile reduction positions through a 2-stage cp.async pipeline; load_p(step, dst)
// and load_x(step, dst) fill a step's P tile (kTile × kTile, stride kSp) and dense tile (kTile × D,
// stride kS). TRANSPOSED: the output rows are P's columns (tn), else its rows (nn).
template <class Cfg, bool TRANSPOSED, class LoadP, class LoadX>
__device__ __forceinline__ void sparse_product(float (&acc)[Cfg::kHeadDim / 8][4], int total, LoadP load_p,
                                               LoadX load_x) {
  using T = typename Cfg::T;
  using Plan = OpsPlan<Cfg>;
  constexpr int TL = Plan::kTile, D = Cfg::kHeadDim, S = Plan::kS, SP = Plan::kSp;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ps = reinterpret_cast<T*>(smem);  // [2][TL][SP]
  T* Xs = Ps + 2 * TL * SP;            // [2][TL][S]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane / 8, r8 = lane % 8;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  auto load = [&](int step) {
    load_p(step, Ps + (step % 2) * TL * SP);
    load_x(step, Xs + (step % 2) * TL * S);
  };
  run_pipeline<2>(total, load, [&](int step) {
    const T* ps = Ps + (step % 2) * TL * SP;
    const T* xs = Xs + (step % 2) * TL * S;
#pragma unroll
    for (int kk = 0; kk < TL / 16; ++kk) {
      unsigned frag[4];
      if (TRANSPOSED)  // A = Pᵀ: P's rows are the reduction
        ldmatrix_x4_trans(frag, ps + (kk * 16 + r8 + (quad / 2) * 8) * SP + warp * 16 + (quad % 2) * 8);
      else
        ldmatrix_x4(frag, ps + (warp * 16 + lane % 16) * SP + kk * 16 + (lane / 16) * 8);
      warp_mma_mn_major<T, D, S>(acc, frag, xs + kk * 16 * S);
    }
  });
}

// This warp's 16 rows × D of acc to rows row0.. of a q- or k-shaped tensor.
template <class Cfg>
__device__ __forceinline__ void store_rows(typename Cfg::T* out, const QkvIndex<Cfg>& ix, long long row0,
                                           const float (&acc)[Cfg::kHeadDim / 8][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const long long r = row0 + (threadIdx.x / 32) * 16 + g;
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
    store_pair(out + ix.at(r) + 8 * j + 2 * t4, acc[j][0], acc[j][1], 0);
    store_pair(out + ix.at(r + 8) + 8 * j + 2 * t4, acc[j][2], acc[j][3], 0);
  }
}

// One CTA of a product: kTile output rows of one (batch, head), summed over the blocks of the
// mask's row (nn: out's query rows = Σ P·X, X shaped like K) or column (TRANSPOSED, tn: out's key
// rows = Σ Pᵀ·X, X shaped like Q); tiles in the generator's launch order.
template <class Cfg, bool TRANSPOSED>
__device__ __forceinline__ void sparse_product_tile(const typename Cfg::T* __restrict__ probs,
                                                    const typename Cfg::T* __restrict__ x,
                                                    typename Cfg::T* __restrict__ out, int heads) {
  using Plan = OpsPlan<Cfg>;
  constexpr int TL = Plan::kTile, kSub = Cfg::kBlock / TL;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  const int b = blockIdx.x / heads, h = blockIdx.x % heads, layout = Cfg::kLayouts == 1 ? 0 : h;
  const SparseSlice<Cfg> slice(b, h, heads);
  const long long o0 =
      static_cast<long long>((TRANSPOSED ? Cfg::key_tile_order() : Cfg::tile_order())[blockIdx.y]) * TL;
  const int line = static_cast<int>(o0 / Cfg::kBlock), in_block = static_cast<int>(o0 % Cfg::kBlock);
  const int* start = TRANSPOSED ? Cfg::col_start() + layout * Cfg::k_blocks() : Cfg::row_start() + layout * Cfg::q_blocks();
  const int begin = start[line], total = (start[line + 1] - begin) * kSub;
  const KvHead<Cfg> kv(h, heads);  // nn: X shaped like K (tn's grouped form: grouped_probs_t_tile)
  const QkvIndex<Cfg> qi(b, h, heads, seq_q), ki(b, kv.head, kv.heads, seq_k);
  float acc[Cfg::kHeadDim / 8][4];
  sparse_product<Cfg, TRANSPOSED>(
      acc, total,
      [&](int step, typename Cfg::T* dst) {  // P's tile: rows of the output (nn) or of the reduction (tn)
        const int pos = TRANSPOSED ? Cfg::col_positions()[begin + step / kSub] : begin + step / kSub;
        const int r0 = TRANSPOSED ? (step % kSub) * TL : in_block, c0 = TRANSPOSED ? in_block : (step % kSub) * TL;
        copy_tile_async<TL, TL, Plan::kSp, Plan::kThreads>(
            dst, [&](int r) { return probs + slice.row(pos, r0 + r) + c0; }, [](int) { return true; });
      },
      [&](int step, typename Cfg::T* dst) {  // X's rows: the step's keys (nn) or queries (tn)
        const int other = (TRANSPOSED ? Cfg::query_blocks() : Cfg::keys())[begin + step / kSub];
        const long long p0 = static_cast<long long>(other) * Cfg::kBlock + (step % kSub) * TL;
        copy_tile_async<TL, Cfg::kHeadDim, Plan::kS, Plan::kThreads>(
            dst, [&](int r) { return x + (TRANSPOSED ? qi : ki).at(p0 + r); }, [](int) { return true; });
      });
  store_rows<Cfg>(out, TRANSPOSED ? ki : qi, o0, acc);
}

// tn under grouped-query attention: kTile key rows of one (batch, key/value head) = Σ over the
// group's kKvGroup query heads and their column's blocks of Pᵀ·X, the heads one after the other.
template <class Cfg>
__device__ __forceinline__ void grouped_probs_t_tile(const typename Cfg::T* __restrict__ probs,
                                                     const typename Cfg::T* __restrict__ x,
                                                     typename Cfg::T* __restrict__ out, int heads) {
  using Plan = OpsPlan<Cfg>;
  constexpr int TL = Plan::kTile, kSub = Cfg::kBlock / TL, G = Cfg::kKvGroup;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  const int kv_heads = heads / G, b = blockIdx.x / kv_heads, hk = blockIdx.x % kv_heads;
  const long long o0 = static_cast<long long>(Cfg::key_tile_order()[blockIdx.y]) * TL;
  const int line = static_cast<int>(o0 / Cfg::kBlock), in_block = static_cast<int>(o0 % Cfg::kBlock);
  // member m (query head hk · G + m): its column's entries from begin(m), steps(m) steps
  auto begin = [&](int m) { return Cfg::col_start()[(Cfg::kLayouts == 1 ? 0 : hk * G + m) * Cfg::k_blocks() + line]; };
  auto steps = [&](int m) {
    return (Cfg::col_start()[(Cfg::kLayouts == 1 ? 0 : hk * G + m) * Cfg::k_blocks() + line + 1] - begin(m)) * kSub;
  };
  int total = 0;
  for (int m = 0; m < G; ++m) total += steps(m);
  struct Step {
    int head, entry, sub;  // query head, column entry, kTile of the block
  };
  auto at = [&](int step) {
    int m = 0;
    if constexpr (Cfg::kLayouts == 1) {
      m = step / steps(0), step %= steps(0);  // every member has the shared mask's column
    } else {
      for (int n = steps(0); step >= n; n = steps(m)) step -= n, ++m;
    }
    return Step{hk * G + m, begin(m) + step / kSub, step % kSub};
  };
  float acc[Cfg::kHeadDim / 8][4];
  sparse_product<Cfg, true>(
      acc, total,
      [&](int step, typename Cfg::T* dst) {  // P's tile: rows of the reduction
        const Step s = at(step);
        const SparseSlice<Cfg> slice(b, s.head, heads);
        const int pos = Cfg::col_positions()[s.entry];
        copy_tile_async<TL, TL, Plan::kSp, Plan::kThreads>(
            dst, [&](int r) { return probs + slice.row(pos, s.sub * TL + r) + in_block; }, [](int) { return true; });
      },
      [&](int step, typename Cfg::T* dst) {  // X's rows: the step's queries of its head
        const Step s = at(step);
        const QkvIndex<Cfg> qi(b, s.head, heads, seq_q);
        const long long p0 = static_cast<long long>(Cfg::query_blocks()[s.entry]) * Cfg::kBlock + s.sub * TL;
        copy_tile_async<TL, Cfg::kHeadDim, Plan::kS, Plan::kThreads>(
            dst, [&](int r) { return x + qi.at(p0 + r); }, [](int) { return true; });
      });
  store_rows<Cfg>(out, QkvIndex<Cfg>(b, hk, kv_heads, seq_k), o0, acc);
}

// grid (batch · heads, seq_q / kTile): out's kTile query rows = Σ over the row's blocks P·V.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kTile * 2)
    attention_probs_v_kernel(const typename Cfg::T* __restrict__ probs, const typename Cfg::T* __restrict__ v,
                             typename Cfg::T* __restrict__ out, int heads) {
  sparse_product_tile<Cfg, false>(probs, v, out, heads);
}

// grid (batch · heads / kKvGroup, seq_k / kTile): out's kTile key rows = Σ over the column's blocks
// (of every query head of the group) Pᵀ·X.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kTile * 2)
    attention_probs_t_kernel(const typename Cfg::T* __restrict__ probs, const typename Cfg::T* __restrict__ x,
                             typename Cfg::T* __restrict__ out, int heads) {
  if constexpr (Cfg::kKvGroup == 1) sparse_product_tile<Cfg, true>(probs, x, out, heads);
  else grouped_probs_t_tile<Cfg>(probs, x, out, heads);
}

}  // namespace kernels
}  // namespace bsjit
