// The sizes of one convolution call as its kernels take them: a kernel parameter passed by value,
// laid out alike by the host compiler (runtime/conv.cpp fills it) and by NVRTC, so plain ints only.
#pragma once

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

}  // namespace kernels
}  // namespace bsjit
