// Reading integers from JSON that other programs wrote (layouts, manifests, cache entry headers,
// tuning records): a value that is not an integer in range is refused with a message, never
// converted (nlohmann's get<int>() of 1e300 or 2.5 is undefined behaviour or a silent truncation).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "bsjit/error.hpp"

namespace bsjit {

// v as an integer in [lo, hi]; else bsjit::Error naming `what` and the value.
inline std::int64_t json_integer(const nlohmann::json& v, std::int64_t lo, std::int64_t hi, const std::string& what) {
  if (!v.is_number_integer()) throw Error(fmt::format("{} must be an integer; got {}", what, v.dump()));
  const bool above =
      v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi) : v.get<std::int64_t>() > hi;
  if (above || v.get<std::int64_t>() < lo)
    throw Error(fmt::format("{} must be in [{}, {}]; got {}", what, lo, hi, v.dump()));
  return v.get<std::int64_t>();
}

}  // namespace bsjit
