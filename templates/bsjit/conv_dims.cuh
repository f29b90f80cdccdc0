// The sizes of one convolution call as its kernels take them: a kernel parameter passed by value,
// laid out alike by the host compiler (runtime/conv.cpp fills it) and by NVRTC, so plain ints only.
#pragma once

#ifndef BSJIT_HOST_DEVICE
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define BSJIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define BSJIT_HOST_DEVICE inline
#endif
#endif

namespace bsjit {
namespace kernels {

struct ConvDims {
  int n, c, k;      // batch, input channels, output channels
  int in[3];        // D, H, W
  int out[3];       // M, P, Q
  int filter[3];    // T, R, S
  int stride[3];    // per dimension
  int dilation[3];  // per dimension
  int pad[3];       // padding before, per dimension (the output's size says the rest)
};

// updat's CTAs a block for each range of positions where a CTA takes `group` consecutive taps (the
// last group may hold fewer): the kernels' x decoding (ConvUpdatRange) and the runtime's grid.
BSJIT_HOST_DEVICE int conv_tap_groups(int taps, int group) { return (taps + group - 1) / group; }

}  // namespace kernels
}  // namespace bsjit
