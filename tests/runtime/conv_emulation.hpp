// What the CPU runs of the convolution kernels share (conv_emulation_test.cpp,
// conv_igemm_emulation_test.cpp): the emulation of CUDA, values as the kernels' element types, the
// generator's tables, per-block gates and the gated reference filter.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bsjit/conv_layout.hpp"
#include "bsjit/types.hpp"
#include "generator/device_tables.hpp"
#include "kernel_emulation.hpp"
#include "reference.hpp"

namespace bsjit::emulation {

// Values as the kernels' element type T (the dtype's encoding), and back.
template <class T>
std::vector<T> typed(DType dtype, const std::vector<double>& v) {
  const auto bytes = reference::encode(dtype, v);
  std::vector<T> out(v.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}
template <class T>
std::vector<double> doubles(DType dtype, const std::vector<T>& v) {
  std::vector<std::uint8_t> bytes(v.size() * sizeof(T));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return reference::decode(dtype, bytes);
}

inline const int* table(const generator::DeviceTables& tables, const char* name) {
  for (const auto& t : tables)
    if (t.name == name) return t.values.data();
  ADD_FAILURE() << "no table " << name;
  return nullptr;
}

inline std::vector<float> gate_of(std::size_t blocks) {
  std::vector<float> gate(blocks);
  for (std::size_t i = 0; i < blocks; ++i) gate[i] = i % 3 == 1 ? 0.0f : 0.5f + 0.25f * static_cast<float>(i % 4);
  return gate;
}

// Each block's filter scaled by its gate (the reference of a gated fprop and bprop).
inline std::vector<double> gated_filter(const ConvLayout& l, std::int64_t taps, const std::vector<double>& filter,
                                        const std::vector<float>& gate) {
  std::vector<double> out(filter);
  for (std::size_t i = 0; i < l.blocks().size(); ++i) {
    const std::int64_t begin = l.filter_offset(i, taps),
                       end = begin + static_cast<std::int64_t>(l.blocks()[i].c.size() * l.blocks()[i].k.size()) * taps;
    for (std::int64_t e = begin; e < end; ++e) out[e] *= gate[i];
  }
  return out;
}

}  // namespace bsjit::emulation
