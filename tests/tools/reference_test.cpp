// The CPU reference is what every GPU result is judged by: check it on hand-computed cases.
#include "reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace bsjit::reference {
namespace {

std::uint16_t bits16(DType dt, double v) {
  auto b = encode(dt, {v});
  std::uint16_t h;
  std::memcpy(&h, b.data(), 2);
  return h;
}

TEST(Reference, HalfAndBfloat16Encoding) {
  EXPECT_EQ(bits16(DType::f16, 1.0), 0x3c00);
  EXPECT_EQ(bits16(DType::f16, -2.0), 0xc000);
  EXPECT_EQ(bits16(DType::f16, 65504.0), 0x7bff);
  EXPECT_EQ(bits16(DType::f16, 1e6), 0x7c00);                     // overflow → inf
  EXPECT_EQ(bits16(DType::f16, std::ldexp(1.0, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(bits16(DType::f16, 1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie → even
  EXPECT_EQ(bits16(DType::f16, 1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);
  EXPECT_EQ(bits16(DType::bf16, 1.0), 0x3f80);
  EXPECT_EQ(bits16(DType::bf16, 1.0 + std::ldexp(1.0, -8)), 0x3f80);  // tie → even
  EXPECT_EQ(bits16(DType::bf16, 1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    std::vector<double> v = {0.0, 1.0, -0.5, 0.25, 3.0};
    EXPECT_EQ(decode(dt, encode(dt, v)), v);
  }
  EXPECT_NE(round_to(DType::bf16, {0.1})[0], 0.1);
}

// 2 × 2 layout of 2 × 2 blocks, blocks at (0,0) and (1,1): W = [[1 2 0 0] [3 4 0 0] [0 0 5 6] [0 0 7 8]]
TEST(Reference, HandComputedOps) {
  Layout L = Layout::from_dense(2, 2, {1, 0, 0, 1});
  Problem p{&L, 2, FeatureAxis::last, 1};
  std::vector<double> w = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> x = {1, 1, 2, 1};
  EXPECT_EQ(matmul(p, Op::forward, x, w), (std::vector<double>{4, 6, 17, 20}));
  std::vector<double> dy = {1, 0, 0, 1};
  EXPECT_EQ(matmul(p, Op::backward_data, dy, w), (std::vector<double>{1, 3, 6, 8}));
  // dW blocks = (Xᵀ dY) at (0,0) and (1,1): outer product of x and dy restricted to the blocks
  EXPECT_EQ(matmul(p, Op::backward_weight, x, dy), (std::vector<double>{1, 0, 1, 0, 0, 2, 0, 1}));
  // gate scales block 1, accumulate adds
  std::vector<double> before = {10, 10, 10, 10};
  EXPECT_EQ(matmul(p, Op::forward, x, w, &before, {1.0f, 0.5f}), (std::vector<double>{14, 16, 18.5, 20}));
  // feature-first: two rows of N stored [C, N]
  Problem q{&L, 2, FeatureAxis::first, 2};
  std::vector<double> x2 = {1, 0, 1, 0, 2, 0, 1, 1};  // column m=0 is x, column m=1 is (0,0,0,1)
  EXPECT_EQ(matmul(q, Op::forward, x2, w), (std::vector<double>{4, 0, 6, 0, 17, 7, 20, 8}));
}

TEST(Reference, RelativeError) {
  EXPECT_DOUBLE_EQ(relative_error({1, 2}, {1, 4}), 0.5);
  EXPECT_TRUE(std::isinf(relative_error({NAN, 2}, {1, 2})));
  EXPECT_TRUE(std::isinf(relative_error({1}, {1, 2})));
  EXPECT_EQ(relative_error({0, 0}, {0, 0}), 0.0);
}

}  // namespace
}  // namespace bsjit::reference
