// CPU reference for the matmul ops, for the tests, `bsjit run` and the benchmark: the dense product
// in double precision with the block mask expanded into a dense W, plus host conversions to and from
// fp16/bf16 bits.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"

namespace bsjit::reference {

// Element bytes of dtype for each value (rounded to nearest even); and back to double.
std::vector<std::uint8_t> encode(DType dtype, const std::vector<double>& values);
std::vector<double> decode(DType dtype, const std::vector<std::uint8_t>& bytes);
// values rounded to what dtype can hold: decode(encode(values)).
std::vector<double> round_to(DType dtype, const std::vector<double>& values);

// Uniform in [-1, 1), rounded to dtype.
std::vector<double> random_values(DType dtype, std::size_t count, std::mt19937_64& rng);

struct Problem {
  const Layout* layout = nullptr;
  int block = 0;
  FeatureAxis feature_axis = FeatureAxis::last;
  std::int64_t n = 0;
};

// The op's result. a, b are the op's two inputs in the order MatMul takes them (forward: x, w;
// backward_data: dy, w; backward_weight: x, dy). With accumulate the result adds to `before`; a
// non-empty gate scales W block i by gate[i].
std::vector<double> matmul(const Problem& p, Op op, const std::vector<double>& a, const std::vector<double>& b,
                           const std::vector<double>* before = nullptr, const std::vector<float>& gate = {});

// Number of elements of each operand of op: {first input, second input, output}.
struct Sizes {
  std::int64_t a, b, out;
};
Sizes sizes(const Problem& p, Op op);

// max |got - want| / max |want| (normwise relative error); infinity when got has NaN or Inf.
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace bsjit::reference
