// The combinations the attention GPU tests draw from: every block size, head dim 32/64/128, fp16
// and bf16, both tensor orders, causal or not.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "bsjit/types.hpp"

namespace bsjit::testing {

struct AttentionCase {
  int block, head_dim;
  DType dtype;
  QkvOrder order;
  bool causal;
};

inline std::vector<AttentionCase> all_attention_cases() {
  std::vector<AttentionCase> v;
  for (int block : {16, 32, 64, 128})
    for (int d : {32, 64, 128})
      for (DType dt : {DType::f16, DType::bf16})
        for (QkvOrder order : {QkvOrder::bshd, QkvOrder::bhsd})
          for (bool causal : {false, true}) v.push_back({block, d, dt, order, causal});
  return v;
}

// Every third case from `first`: each block size, head dim, dtype and order still appears.
inline std::vector<AttentionCase> every_third_attention_case(std::size_t first) {
  std::vector<AttentionCase> v;
  const auto all = all_attention_cases();
  for (std::size_t i = first; i < all.size(); i += 3) v.push_back(all[i]);
  return v;
}

inline std::string case_name(const AttentionCase& c) {
  return fmt::format("b{}_d{}_{}_{}{}", c.block, c.head_dim, to_string(c.dtype), to_string(c.order),
                     c.causal ? "_causal" : "");
}

}  // namespace bsjit::testing
