// Small value types shared by the public API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// Same type as CUstream (driver API) and cudaStream_t (runtime API), so either converts implicitly
// without this header pulling in cuda.h.
struct CUstream_st;

namespace bsjit {

using Stream = CUstream_st*;

// Element type of X, W and Y. Accumulation is always fp32.
enum class DType { f32, f16, bf16 };

// The three products of a sparse weight layer.
enum class Op {
  forward,          // Y[N,K]  = X[N,C] · W
  backward_data,    // dX[N,C] = dY[N,K] · Wᵀ
  backward_weight,  // dW      = Xᵀ · dY on the layout's nonzero blocks only
};

// Where the feature dimension of X and Y lies (openai/blocksparse's feature_axis):
// last: X is [N, C] row-major; first: X is [C, N] row-major.
enum class FeatureAxis { last, first };

// Which calls of an op to get kernels ready for (MatMul::precompile and prepare, a manifest's
// "calls"). An op has two kernels: calls without OpOptions (neither accumulate nor gate) run a
// plain one, built without those paths and a tenth to a half faster to compile on Hopper; calls
// with either option run the general one. A kernel not made ready is compiled at its first call.
enum class Calls { all, plain, with_options };

// Where the channels lie in a convolution's activations: N, C, D, H, W (openai/blocksparse's
// order) or N, D, H, W, C (channels last: PyTorch's channels_last, what tensor cores want).
enum class ActivationOrder { ncdhw, ndhwc };

// Attention tensors Q, K, V, O: [batch, seq, heads, head_dim] or [batch, heads, seq, head_dim].
enum class QkvOrder { bshd, bhsd };

std::string_view to_string(DType dtype);
std::string_view to_string(Op op);
std::string_view to_string(FeatureAxis axis);
std::string_view to_string(QkvOrder order);
std::string_view to_string(Calls calls);
std::string_view to_string(ActivationOrder order);
DType parse_dtype(std::string_view text);  // "f32"/"fp32"/"float32", "f16"/"fp16", "bf16"
Op parse_op(std::string_view text);        // "forward"/"fwd", "backward_data"/"bwd_data", ...
FeatureAxis parse_feature_axis(std::string_view text);  // "last"/"nc", "first"/"cn"
QkvOrder parse_qkv_order(std::string_view text);        // "bshd", "bhsd"
Calls parse_calls(std::string_view text);               // "all", "plain", "with_options"
ActivationOrder parse_activation_order(std::string_view text);  // "ndhwc"/"channels_last", "ncdhw"/"channels_first"
std::size_t dtype_size(DType dtype);

}  // namespace bsjit
