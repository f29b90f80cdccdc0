// Block-sparse attention, fused forward (flash-style): the output and log-sum-exp of
// softmax(scale · Q·Kᵀ + masks) · V over only the key blocks the layout gives each query block.
//
// One CTA takes kQTile query rows of one (batch, head): kQTile / 16 warps of 16 rows each. It walks
// the LUT of its query block (the layout's row, for this head), kKTile keys at a time: K and V tiles
// come through a 2-stage cp.async pipeline; S = Q·Kᵀ (mma.sync m16n8k16, fp32) is masked (causal
// inside the diagonal, padded keys), folded into a running row max and sum in the log2 domain
// (exp2), and P, rounded to 16 bits straight from the accumulator registers, multiplies V into the
// output accumulators. A row that attends no key writes zeros and a log-sum-exp of -inf.
#pragma once

#include "bsjit/common.cuh"
#include "bsjit/pipeline.cuh"

namespace bsjit {
namespace kernels {

// The A fragment of k16 step c (n8 accumulator tiles 2c and 2c + 1 of a warp's 16 rows, the
// mma accumulator layout being the A-fragment layout), rounded to 16 bits.
template <class T, int N>
__device__ __forceinline__ void accumulator_fragment(unsigned (&a)[4], const float (&acc)[N][4], int c) {
  a[0] = pack_pair<T>(acc[2 * c][0], acc[2 * c][1]);
  a[1] = pack_pair<T>(acc[2 * c][2], acc[2 * c][3]);
  a[2] = pack_pair<T>(acc[2 * c + 1][0], acc[2 * c + 1][1]);
  a[3] = pack_pair<T>(acc[2 * c + 1][2], acc[2 * c + 1][3]);
}

// acc (a warp's 16 rows × N) += a (16 × 16 A fragments) · B, B's 16 k rows × N at b in a
// K-major tile (row n holds the k indices, stride STRIDE) or an MN-major one (row k holds n).
template <class T, int N, int STRIDE>
__device__ __forceinline__ void warp_mma_k_major(float (&acc)[N / 8][4], const unsigned (&a)[4], const T* b) {
  const int lane = threadIdx.x % 32, quad = lane / 8, r8 = lane % 8;
#pragma unroll
  for (int j = 0; j < N / 8; j += 2) {
    unsigned r[4];
    ldmatrix_x4(r, b + (j * 8 + r8 + (quad / 2) * 8) * STRIDE + (quad % 2) * 8);
    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
    Mma16816<T>::run(acc[j], a, b0);
    Mma16816<T>::run(acc[j + 1], a, b1);
  }
}
template <class T, int N, int STRIDE>
__device__ __forceinline__ void warp_mma_mn_major(float (&acc)[N / 8][4], const unsigned (&a)[4], const T* b) {
  const int lane = threadIdx.x % 32, quad = lane / 8, r8 = lane % 8;
#pragma unroll
  for (int j = 0; j < N / 8; j += 2) {
    unsigned r[4];
    ldmatrix_x4_trans(r, b + (r8 + (quad % 2) * 8) * STRIDE + j * 8 + (quad / 2) * 8);
    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
    Mma16816<T>::run(acc[j], a, b0);
    Mma16816<T>::run(acc[j + 1], a, b1);
  }
}

// acc (this warp's 16 rows × N) += A·Bᵀ over K reduction indices, both tiles K-major (stride
// STRIDE): A's 16 rows at a, B's N rows at b.
template <class T, int N, int K, int STRIDE>
__device__ __forceinline__ void warp_mma_rows(float (&acc)[N / 8][4], const T* a, const T* b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned frag[4];
    ldmatrix_x4(frag, a + (lane % 16) * STRIDE + kk * 16 + (lane / 16) * 8);
    warp_mma_k_major<T, N, STRIDE>(acc, frag, b + kk * 16);
  }
}

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// 2^x on the special-function unit (2 ulp; exp2(-inf) = 0), without exp2f's denormal handling.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Position p of (b, h) in a [batch, seq, heads, d] or [batch, heads, seq, d] tensor: base + p · stride.
template <class Cfg>
struct QkvIndex {
  long long base, stride;
  __device__ QkvIndex(int b, int h, int heads, long long seq) {
    stride = Cfg::kHeadsFirst ? Cfg::kHeadDim : static_cast<long long>(heads) * Cfg::kHeadDim;
    base = Cfg::kHeadsFirst ? (static_cast<long long>(b) * heads + h) * seq * Cfg::kHeadDim
                            : static_cast<long long>(b) * seq * heads * Cfg::kHeadDim +
                                  static_cast<long long>(h) * Cfg::kHeadDim;
  }
  __device__ long long at(long long p) const { return base + p * stride; }
};

// The key/value head of query head h of `heads` (grouped-query attention: Cfg::kKvGroup query heads
// share one key/value head, K and V having heads / kKvGroup heads; 1 is multi-head attention).
template <class Cfg>
struct KvHead {
  int head, heads;
  __device__ KvHead(int h, int query_heads) : head(h / Cfg::kKvGroup), heads(query_heads / Cfg::kKvGroup) {}
};

// Whether Cfg runs a block-64 mask on tiles of 128 (the Hopper kernels; generator::CoarseMasks): each
// entry of its lists then has a table entry of 4 bits beside it (Cfg::key_quadrants() forward,
// query_quadrants() backward), bit 2i + j set where the tile's 64-block (query half i, key half j)
// is in the mask; the kernels mask the others' scores as they mask keys after the query. (An
// enumerator, not a static constexpr member, which NVRTC would emit as a device global, changing
// the binary of every kernel.)
template <class Cfg, class = void>
struct Quadrants {
  enum : bool { kOn = false };
};
template <class Cfg>
struct Quadrants<Cfg, decltype(void(Cfg::kQuadrants))> {
  enum : bool { kOn = Cfg::kQuadrants != 0 };
};

// Where a CTA of the fused kernels works. Their grid is one-dimensional, batch · heads · tiles CTAs,
// in bands of `band` consecutive (batch, head) pairs (the last band narrower); within a band, the
// tiles in the generator's launch order (most key blocks first), each rank for every pair of the
// band in turn. A band's CTAs stream the same heads' K and V (forward) or Q and dO (backward), so
// the host makes a band as wide as fits half of the GPU's L2 (runtime/attention.cpp, head_band).
// With heads fastest over the whole grid, a wave of CTAs read every head's tensors from DRAM: on an
// H100 the head-dim-128 causal forward took 2.76 ms that way and 1.79 banded, the backward 12.4 and
// 8.0 (docs/PERFORMANCE.md, "The banded grid", 8ff3371).
struct BandedTile {
  int pairs;  // batch · heads
  int bh;     // this CTA's batch · heads + head
  int rank;   // its tile's place in the launch order
  __device__ BandedTile(int tiles, int band) {
    pairs = gridDim.x / tiles;
    const int first = blockIdx.x / (band * tiles) * band, width = min(band, pairs - first);
    const int r = blockIdx.x - first * tiles;
    rank = r / width, bh = first + r % width;
  }
};

template <class Cfg>
struct AttentionPlan {
  static constexpr int kS = Cfg::kHeadDim + kPad;  // row stride of the Q, K and V tiles
  static constexpr int kSharedBytes = (Cfg::kQTile + 2 * 2 * Cfg::kKTile) * kS * 2;
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kQTile * 2)
    attention_forward_kernel(const typename Cfg::T* __restrict__ q, const typename Cfg::T* __restrict__ k,
                             const typename Cfg::T* __restrict__ v, typename Cfg::T* __restrict__ out,
                             float* __restrict__ lse, const unsigned char* __restrict__ key_padding, int heads,
                             int band, float scale_log2) {
  using T = typename Cfg::T;
  using Plan = AttentionPlan<Cfg>;
  constexpr int D = Cfg::kHeadDim, QT = Cfg::kQTile, KT = Cfg::kKTile, S = Plan::kS;
  constexpr int kThreads = QT * 2, kSubTiles = Cfg::kBlock / KT;
  const long long seq_q = static_cast<long long>(Cfg::q_blocks()) * Cfg::kBlock;
  const long long seq_k = static_cast<long long>(Cfg::k_blocks()) * Cfg::kBlock;
  static_assert(sizeof(T) == 2 && D % 16 == 0 && QT % 16 == 0 && KT % 16 == 0 && Cfg::kBlock % KT == 0 &&
                    Cfg::kBlock % QT == 0,
                "16-bit; head dim, query and key tiles in whole mma tiles; tiles divide the block");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + QT * S;  // [2][KT][S]
  T* Vs = Ks + 2 * KT * S;

  const BandedTile cta(static_cast<int>(seq_q / QT), band);
  const int b = cta.bh / heads, h = cta.bh % heads;
  const long long q0 = static_cast<long long>(Cfg::tile_order()[cta.rank]) * QT;
  // Position p of (b, h) starts at base + p · stride: [batch, seq, heads, D] or [batch, heads, seq, D].
  const long long stride = Cfg::kHeadsFirst ? D : static_cast<long long>(heads) * D;
  const long long q_base = Cfg::kHeadsFirst ? (static_cast<long long>(b) * heads + h) * seq_q * D
                                            : static_cast<long long>(b) * seq_q * heads * D + static_cast<long long>(h) * D;
  // K and V: key/value head h / kKvGroup of heads / kKvGroup (grouped-query attention; 1: multi-head)
  const KvHead<Cfg> kv(h, heads);
  const long long k_stride = Cfg::kHeadsFirst ? D : static_cast<long long>(kv.heads) * D;
  const long long k_base = Cfg::kHeadsFirst ? (static_cast<long long>(b) * kv.heads + kv.head) * seq_k * D
                                            : static_cast<long long>(b) * seq_k * kv.heads * D +
                                                  static_cast<long long>(kv.head) * D;
  const int layout = Cfg::kLayouts == 1 ? 0 : h;
  const int row = static_cast<int>(q0 / Cfg::kBlock);
  const int begin = Cfg::row_start()[layout * Cfg::q_blocks() + row], end = Cfg::row_start()[layout * Cfg::q_blocks() + row + 1];
  const int total = (end - begin) * kSubTiles;
  const int* const keys = Cfg::keys() + begin;  // the row's key blocks (as in attention_hopper.cuh)

  copy_tile_async<QT, D, S, kThreads>(Qs, [&](int r) { return q + q_base + (q0 + r) * stride; }, [](int) { return true; });
  auto key0 = [&](int step) {
    return static_cast<long long>(keys[step / kSubTiles]) * Cfg::kBlock + (step % kSubTiles) * KT;
  };
  auto load = [&](int step) {
    const long long k0 = key0(step);
    copy_tile_async<KT, D, S, kThreads>(Ks + (step % 2) * KT * S, [&](int r) { return k + k_base + (k0 + r) * k_stride; },
                                        [](int) { return true; });
    copy_tile_async<KT, D, S, kThreads>(Vs + (step % 2) * KT * S, [&](int r) { return v + k_base + (k0 + r) * k_stride; },
                                        [](int) { return true; });
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  unsigned qa[D / 16][4];  // this warp's 16 query rows as A fragments, loaded once the tile lands
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 domain
  const long long my_row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  run_pipeline<2>(total, load, [&](int step) {
    if (step == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qa[kk], Qs + (warp * 16 + lane % 16) * S + kk * 16 + (lane / 16) * 8);
    }
    const T* ks = Ks + (step % 2) * KT * S;
    const T* vs = Vs + (step % 2) * KT * S;
    const long long k0 = key0(step);
    float s[KT / 8][4];
#pragma unroll
    for (int j = 0; j < KT / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) warp_mma_k_major<T, KT, S>(s, qa[kk], ks + kk * 16);  // K rows: keys
    // scale into the log2 domain, mask, and fold into the running max and sum
    float tile_max[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long key = k0 + j * 8 + 2 * t4 + (e & 1);
        bool keep = !(Cfg::kCausal && key > my_row[e >> 1]);
        if (key_padding != nullptr) keep = keep && key_padding[b * seq_k + key] != 0;
        s[j][e] = keep ? s[j][e] * scale_log2 : minus_infinity();
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
      }
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float m_new = fmaxf(m[i], tile_max[i]);
      corr[i] = m_new == minus_infinity() ? 1.0f : exp2f(m[i] - m_new);  // exp2(-inf) = 0 when m was -inf
      m[i] = m_new;
      l[i] *= corr[i];
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mi = m[e >> 1];
        s[j][e] = s[j][e] == minus_infinity() ? 0.0f : exp2f(s[j][e] - mi);
        l[e >> 1] += s[j][e];
      }
    // O += P · V: P's accumulator layout is the A-fragment layout, two n8 tiles per k16 step
#pragma unroll
    for (int kc = 0; kc < KT / 16; ++kc) {
      unsigned pa[4];
      accumulator_fragment<T>(pa, s, kc);
      warp_mma_mn_major<T, D, S>(o, pa, vs + kc * 16 * S);  // V rows: keys (k), d contiguous
    }
  });

  // the row sums are spread over the 4 lanes of a quad
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      store_pair(out + q_base + my_row[i] * stride + j * 8 + 2 * t4, o[j][2 * i] * inv[i], o[j][2 * i + 1] * inv[i], 0);
  if (t4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      lse[(static_cast<long long>(b) * heads + h) * seq_q + my_row[i]] =
          l[i] > 0.0f ? (m[i] + log2f(l[i])) * kLn2 : minus_infinity();
  }
}

}  // namespace kernels
}  // namespace bsjit
