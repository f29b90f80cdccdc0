// conv_{fprop,bprop,updat}_kernel: block-sparse convolution computed directly, one output element
// per thread and step of a grid-stride loop, in fp32 on the FMA pipes: exact for fp32 inputs, and
// the path of every layout (blocks of any channel lists, overlapping ones included), geometry (1-3
// dimensions, strides, dilations, padding) and activation order. The sizes are a kernel argument
// (ConvDims) and the layout's lists are pointer tables (generator/device_tables.hpp), so one
// compile per dtype and order serves every layout and geometry.
//
// The layout's tables (generator/conv_generator.cpp), read through Cfg::tables():
//   blocks[5 · i ..]: block i's input channels at channels[blocks[5i]], blocks[5i + 1] of them; its
//     output channels at channels[blocks[5i + 2]], blocks[5i + 3] of them; its filter
//     [K_b, C_b, T, R, S] at element blocks[5i + 4] of the layout's filter.
//   out_start[k] .. out_start[k + 1]: the entries of output channel k in out_entries, pairs (block,
//     the channel's index in the block's output list); in_start / in_entries the same per input
//     channel.
// A per-block gate scales the block's contribution (fprop, bprop) or its filter gradient (updat),
// 0 skipping it; accumulate adds the result to the output.
//
// Compiled by NVRTC; the CPU tests also compile this file with a host compiler and run each
// kernel's threads one after another (tests/runtime/conv_emulation_test.cpp), so it uses nothing
// but the thread and block indices and common.cuh's conversions.
#pragma once

#ifndef BSJIT_HOST_EMULATION
#include "bsjit/common.cuh"
#endif
#include "bsjit/conv_dims.cuh"

namespace bsjit {
namespace kernels {

// An enumerator: a constexpr variable at namespace scope is a global in the module (an internal one
// named afresh by each compile, or an inline one), which no kernel reads.
enum : int { kConvThreads = 256 };

struct ConvTables {
  const int* blocks;
  const int* channels;
  const int* out_start;
  const int* out_entries;
  const int* in_start;
  const int* in_entries;
  const int* rows;  // the filter's rows for l2_normalize (four ints a row)
};

// Element (n, channel, z, y, x) of an activation of `channels` channels over `sizes` positions.
template <bool kChannelsLast>
__device__ __forceinline__ long long conv_at(const int* sizes, int channels, long long n, int channel, int z, int y,
                                             int x) {
  const long long positions = static_cast<long long>(sizes[0]) * sizes[1] * sizes[2];
  const long long pos = (static_cast<long long>(z) * sizes[1] + y) * sizes[2] + x;
  return kChannelsLast ? (n * positions + pos) * channels + channel : (n * channels + channel) * positions + pos;
}

// Element e of an activation as (n, channel, position).
template <bool kChannelsLast>
__device__ __forceinline__ void conv_split(long long e, const int* sizes, int channels, long long& n, int& channel,
                                           long long& pos) {
  const long long positions = static_cast<long long>(sizes[0]) * sizes[1] * sizes[2];
  if (kChannelsLast) {
    channel = static_cast<int>(e % channels);
    const long long r = e / channels;
    pos = r % positions;
    n = r / positions;
  } else {
    pos = e % positions;
    const long long r = e / positions;
    channel = static_cast<int>(r % channels);
    n = r / channels;
  }
}

// f(i) for the i < count this thread takes: a grid-stride loop over the grid's x dimension.
template <class F>
__device__ __forceinline__ void conv_grid_stride(long long count, F f) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    f(i);
}

template <class T>
__device__ __forceinline__ void conv_store(T* out, float v, int accumulate) {
  *out = from_float<T>(accumulate ? to_float(*out) + v : v);
}

// Position pos of a [sizes[0], sizes[1], sizes[2]] image as (z, y, x).
__device__ __forceinline__ void conv_coords(long long pos, const int* sizes, int* at) {
  at[2] = static_cast<int>(pos % sizes[2]);
  at[1] = static_cast<int>(pos / sizes[2] % sizes[1]);
  at[0] = static_cast<int>(pos / (static_cast<long long>(sizes[1]) * sizes[2]));
}

// f(tap, z, y, x) for every filter tap (t, r, s) that joins `at` to a position of the other image:
// reach(d, coordinate, tap) gives that position's coordinate in dimension d, or −1 for none.
template <class Reach, class F>
__device__ __forceinline__ void conv_taps(const ConvDims& p, const int* at, Reach reach, F f) {
  for (int ft = 0; ft < p.filter[0]; ++ft) {
    const int z = reach(0, at[0], ft);
    if (z < 0) continue;
    for (int fr = 0; fr < p.filter[1]; ++fr) {
      const int y = reach(1, at[1], fr);
      if (y < 0) continue;
      for (int fs = 0; fs < p.filter[2]; ++fs) {
        const int x = reach(2, at[2], fs);
        if (x >= 0) f((ft * p.filter[1] + fr) * p.filter[2] + fs, z, y, x);
      }
    }
  }
}

// The input coordinate an output coordinate o reads through tap t in dimension d, or −1 (padding).
__device__ __forceinline__ int conv_input_of(const ConvDims& p, int d, int o, int t) {
  const int i = o * p.stride[d] - p.pad[d] + t * p.dilation[d];
  return i >= 0 && i < p.in[d] ? i : -1;
}

// The output coordinate that reads input coordinate i through tap t in dimension d, or −1.
__device__ __forceinline__ int conv_output_of(const ConvDims& p, int d, int i, int t) {
  const int num = i + p.pad[d] - t * p.dilation[d];
  return num >= 0 && num % p.stride[d] == 0 && num / p.stride[d] < p.out[d] ? num / p.stride[d] : -1;
}

// O = conv(I, F): out[n, k, m, p, q] = Σ over k's blocks, their input channels c and taps of
// in[n, c, m·stride − pad + t·dilation, ...] · F_block[k, c, t, r, s].
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_fprop_kernel(const typename Cfg::T* __restrict__ in, const typename Cfg::T* __restrict__ filter,
                      typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int accumulate, ConvDims p) {
  const ConvTables t = Cfg::tables();
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  const long long total = static_cast<long long>(p.n) * p.k * p.out[0] * p.out[1] * p.out[2];
  conv_grid_stride(total, [&](long long e) {
    long long n, pos;
    int k;
    conv_split<Cfg::kChannelsLast>(e, p.out, p.k, n, k, pos);
    int o[3];
    conv_coords(pos, p.out, o);
    float acc = 0.0f;
    for (int j = t.out_start[k]; j < t.out_start[k + 1]; ++j) {
      const int block = t.out_entries[2 * j], kk = t.out_entries[2 * j + 1];
      const float g = gate != nullptr ? gate[block] : 1.0f;
      if (g == 0.0f) continue;
      const int* b = t.blocks + 5 * block;
      const int* cs = t.channels + b[0];
      const int cb = b[1];
      const typename Cfg::T* f = filter + b[4] + static_cast<long long>(kk) * cb * taps;
      float s = 0.0f;
      conv_taps(
          p, o, [&](int d, int c, int tap) { return conv_input_of(p, d, c, tap); },
          [&](int tap, int z, int y, int x) {
            for (int cc = 0; cc < cb; ++cc)
              s += to_float(in[conv_at<Cfg::kChannelsLast>(p.in, p.c, n, cs[cc], z, y, x)]) *
                   to_float(f[cc * taps + tap]);
          });
      acc += g * s;
    }
    conv_store(out + e, acc, accumulate);
  });
}

// dI from dO: grad_in[n, c, z, y, x] = Σ over c's blocks, their output channels k and the taps
// that reach (z, y, x) from an output position of dO[n, k, ...] · F_block[k, c, tap].
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_bprop_kernel(const typename Cfg::T* __restrict__ grad_out, const typename Cfg::T* __restrict__ filter,
                      typename Cfg::T* __restrict__ grad_in, const float* __restrict__ gate, int accumulate,
                      ConvDims p) {
  const ConvTables t = Cfg::tables();
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  const long long total = static_cast<long long>(p.n) * p.c * p.in[0] * p.in[1] * p.in[2];
  conv_grid_stride(total, [&](long long e) {
    long long n, pos;
    int c;
    conv_split<Cfg::kChannelsLast>(e, p.in, p.c, n, c, pos);
    int i[3];
    conv_coords(pos, p.in, i);
    float acc = 0.0f;
    for (int j = t.in_start[c]; j < t.in_start[c + 1]; ++j) {
      const int block = t.in_entries[2 * j], cc = t.in_entries[2 * j + 1];
      const float g = gate != nullptr ? gate[block] : 1.0f;
      if (g == 0.0f) continue;
      const int* b = t.blocks + 5 * block;
      const int cb = b[1], kb = b[3];
      const int* ks = t.channels + b[2];
      const typename Cfg::T* f = filter + b[4] + static_cast<long long>(cc) * taps;
      float s = 0.0f;
      conv_taps(
          p, i, [&](int d, int c, int tap) { return conv_output_of(p, d, c, tap); },
          [&](int tap, int m, int q, int r) {
            for (int kk = 0; kk < kb; ++kk)
              s += to_float(grad_out[conv_at<Cfg::kChannelsLast>(p.out, p.k, n, ks[kk], m, q, r)]) *
                   to_float(f[static_cast<long long>(kk) * cb * taps + tap]);
          });
      acc += g * s;
    }
    conv_store(grad_in + e, acc, accumulate);
  });
}

// dF on the layout's blocks: element (k, c, t, r, s) of block blockIdx.y's filter is the sum over
// n and output positions of dO[n, k, m, p, q] · I[n, c, m·stride − pad + t·dilation, ...]. Grid:
// x over the largest block's filter elements, y the blocks.
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_updat_kernel(const typename Cfg::T* __restrict__ in, const typename Cfg::T* __restrict__ grad_out,
                      typename Cfg::T* __restrict__ grad_filter, const float* __restrict__ gate, int accumulate,
                      ConvDims p) {
  const ConvTables t = Cfg::tables();
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  const int block = blockIdx.y;
  const int* b = t.blocks + 5 * block;
  const int cb = b[1], kb = b[3];
  const long long elements = static_cast<long long>(kb) * cb * taps;
  const float g = gate != nullptr ? gate[block] : 1.0f;
  conv_grid_stride(elements, [&](long long e) {
    const int kk = static_cast<int>(e / (static_cast<long long>(cb) * taps));
    const int cc = static_cast<int>(e / taps % cb), tap = static_cast<int>(e % taps);
    const int fs = tap % p.filter[2], fr = tap / p.filter[2] % p.filter[1], ft = tap / (p.filter[1] * p.filter[2]);
    const int c = t.channels[b[0] + cc], k = t.channels[b[2] + kk];
    float s = 0.0f;
    if (g != 0.0f) {
      for (long long n = 0; n < p.n; ++n)
        for (int om = 0; om < p.out[0]; ++om) {
          const int z = conv_input_of(p, 0, om, ft);
          if (z < 0) continue;
          for (int op = 0; op < p.out[1]; ++op) {
            const int y = conv_input_of(p, 1, op, fr);
            if (y < 0) continue;
            for (int oq = 0; oq < p.out[2]; ++oq) {
              const int x = conv_input_of(p, 2, oq, fs);
              if (x < 0) continue;
              s += to_float(grad_out[conv_at<Cfg::kChannelsLast>(p.out, p.k, n, k, om, op, oq)]) *
                   to_float(in[conv_at<Cfg::kChannelsLast>(p.in, p.c, n, c, z, y, x)]);
            }
          }
        }
    }
    conv_store(grad_filter + b[4] + e, g * s, accumulate);
  });
}

// blocksparse's filter l2_normalize, one thread a row: row i of the filter (an output channel of a
// block for a convolution, an input channel for a deconvolution) is rows[4i] + o · rows[4i + 1] + e
// for o < rows[4i + 2], e < rows[4i + 3]; out = f / sqrt(max(Σ f², ε)) (× gain[i] when given), and
// sum_squares[i] = Σ f² for the backward. out may be f.
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_l2_normalize_kernel(const typename Cfg::T* f, const float* __restrict__ gain, typename Cfg::T* out,
                             float* __restrict__ sum_squares, float epsilon, int row_count) {
  const int* rows = Cfg::tables().rows;
  conv_grid_stride(row_count, [&](long long i) {
    const int* r = rows + 4 * i;
    float s = 0.0f;
    for (int o = 0; o < r[2]; ++o)
      for (int e = 0; e < r[3]; ++e) {
        const float v = to_float(f[r[0] + static_cast<long long>(o) * r[1] + e]);
        s += v * v;
      }
    sum_squares[i] = s;
    const float scale = (gain != nullptr ? gain[i] : 1.0f) / sqrtf(s > epsilon ? s : epsilon);
    for (int o = 0; o < r[2]; ++o)
      for (int e = 0; e < r[3]; ++e) {
        const long long at = r[0] + static_cast<long long>(o) * r[1] + e;
        out[at] = from_float<typename Cfg::T>(to_float(f[at]) * scale);
      }
  });
}

// Its gradient: with m = max(Σ f², ε), d = (g · u − f · [Σ f² ≥ ε] · Σ(g · u · f) / m) / sqrt(m) for
// the row's upstream gradient u and gain g (1 without one); grad_gain[i] = Σ u · f / sqrt(m).
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_l2_normalize_grad_kernel(const typename Cfg::T* __restrict__ grad_out, const typename Cfg::T* __restrict__ f,
                                  const float* __restrict__ gain, const float* __restrict__ sum_squares,
                                  typename Cfg::T* __restrict__ grad_f, float* __restrict__ grad_gain, float epsilon,
                                  int row_count) {
  const int* rows = Cfg::tables().rows;
  conv_grid_stride(row_count, [&](long long i) {
    const int* r = rows + 4 * i;
    const float s = sum_squares[i], m = s > epsilon ? s : epsilon, g = gain != nullptr ? gain[i] : 1.0f;
    float uf = 0.0f;
    for (int o = 0; o < r[2]; ++o)
      for (int e = 0; e < r[3]; ++e) {
        const long long at = r[0] + static_cast<long long>(o) * r[1] + e;
        uf += to_float(grad_out[at]) * to_float(f[at]);
      }
    const float inv = 1.0f / sqrtf(m), along = s >= epsilon ? g * uf / m : 0.0f;
    if (grad_gain != nullptr) grad_gain[i] = uf * inv;
    for (int o = 0; o < r[2]; ++o)
      for (int e = 0; e < r[3]; ++e) {
        const long long at = r[0] + static_cast<long long>(o) * r[1] + e;
        grad_f[at] = from_float<typename Cfg::T>((g * to_float(grad_out[at]) - to_float(f[at]) * along) * inv);
      }
  });
}

// blocksparse's ConvEdgeBias: the output positions whose receptive field reaches padding, grouped
// by which taps fall outside (generator::conv_edges), each group e with a gain and a bias per
// channel (fp32, [E, channels] channels last, [channels, E] channels first). Cfg::edge_tables():
// of[position] its group or -1; start[e] .. start[e + 1] the group's positions in positions.
struct ConvEdgeTables {
  const int* of;
  const int* start;
  const int* positions;
};

template <bool kChannelsLast>
__device__ __forceinline__ int conv_edge_param(int e, int channel, int channels, int edges) {
  return kChannelsLast ? e * channels + channel : channel * edges + e;
}

// y = x · gain + bias at edge positions, x elsewhere (y may be x); `positions` positions an image.
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_edge_bias_kernel(const typename Cfg::T* x, const float* __restrict__ gain, const float* __restrict__ bias,
                          typename Cfg::T* y, int n, int channels, int positions, int edges) {
  const int* of = Cfg::edge_tables().of;
  const int sizes[3] = {1, 1, positions};
  const long long total = static_cast<long long>(n) * channels * positions;
  conv_grid_stride(total, [&](long long e) {
    long long image, pos;
    int channel;
    conv_split<Cfg::kChannelsLast>(e, sizes, channels, image, channel, pos);
    const int edge = of[pos];
    if (edge < 0) {
      if (x != y) y[e] = x[e];
      return;
    }
    const int at = conv_edge_param<Cfg::kChannelsLast>(edge, channel, channels, edges);
    y[e] = from_float<typename Cfg::T>(to_float(x[e]) * gain[at] + bias[at]);
  });
}

// dx = dy · gain at edge positions, dy elsewhere (dx may be dy).
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_edge_bias_grad_kernel(const typename Cfg::T* dy, const float* __restrict__ gain, typename Cfg::T* dx, int n,
                               int channels, int positions, int edges) {
  const int* of = Cfg::edge_tables().of;
  const int sizes[3] = {1, 1, positions};
  const long long total = static_cast<long long>(n) * channels * positions;
  conv_grid_stride(total, [&](long long e) {
    long long image, pos;
    int channel;
    conv_split<Cfg::kChannelsLast>(e, sizes, channels, image, channel, pos);
    const int edge = of[pos];
    if (edge < 0) {
      if (dx != dy) dx[e] = dy[e];
      return;
    }
    dx[e] = from_float<typename Cfg::T>(to_float(dy[e]) *
                                        gain[conv_edge_param<Cfg::kChannelsLast>(edge, channel, channels, edges)]);
  });
}

// grad_gain = Σ dy · x and grad_bias = Σ dy over the images and the group's positions, one thread
// a (group, channel), in a fixed order.
template <class Cfg>
__global__ void __launch_bounds__(kConvThreads)
    conv_edge_bias_sums_kernel(const typename Cfg::T* __restrict__ dy, const typename Cfg::T* __restrict__ x,
                               float* __restrict__ grad_gain, float* __restrict__ grad_bias, int n, int channels,
                               int positions, int edges) {
  const ConvEdgeTables t = Cfg::edge_tables();
  const int sizes[3] = {1, 1, positions};
  conv_grid_stride(static_cast<long long>(edges) * channels, [&](long long i) {
    const int edge = static_cast<int>(i / channels), channel = static_cast<int>(i % channels);
    float g = 0.0f, b = 0.0f;
    for (int image = 0; image < n; ++image)
      for (int j = t.start[edge]; j < t.start[edge + 1]; ++j) {
        const long long at = conv_at<Cfg::kChannelsLast>(sizes, channels, image, channel, 0, 0, t.positions[j]);
        const float d = to_float(dy[at]);
        g += d * to_float(x[at]);
        b += d;
      }
    const int at = conv_edge_param<Cfg::kChannelsLast>(edge, channel, channels, edges);
    grad_gain[at] = g;
    grad_bias[at] = b;
  });
}

// Moves whole blocks of `elements` elements between two orders: out block p = in block order[p]
// (gather), or out block order[p] = in block p (scatter). Runs a 1×1 convolution's filter (and its
// gate) into the order of the matmul that computes it, and the filter's gradient back
// (generator::conv_matmul_plan).
template <class E>
__global__ void __launch_bounds__(kConvThreads)
    conv_gather_blocks_kernel(const E* __restrict__ in, E* __restrict__ out, const int* __restrict__ order, int blocks,
                              int elements, int scatter) {
  const long long total = static_cast<long long>(blocks) * elements;
  conv_grid_stride(total, [&](long long e) {
    const long long p = e / elements, other = static_cast<long long>(order[p]) * elements + e % elements;
    if (scatter)
      out[other] = in[e];
    else
      out[e] = in[other];
  });
}

}  // namespace kernels
}  // namespace bsjit
