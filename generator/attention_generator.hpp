// Turns (block masks, attention options) into the fused attention kernel's source: the masks'
// per-row key-block lists as constants, instantiating templates/bsjit/attention.cuh.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bsjit/attention.hpp"
#include "bsjit/layout.hpp"

namespace bsjit::generator {

struct GeneratedAttention {
  std::string source, name_expression, label;
  int threads = 0, shared_bytes = 0;
  std::int64_t query_tiles = 0;  // grid x; y = heads, z = batch
  std::int64_t seq_q = 0, seq_k = 0;
};

// Throws Error for masks of different shapes, or options the kernel does not take.
GeneratedAttention generate_attention_forward(const std::vector<Layout>& masks, const AttentionOptions& options);

}  // namespace bsjit::generator
