// The one exception type bsjit throws. Every failure names what was wrong and what was expected;
// the library never aborts or exits.
#pragma once

#include <stdexcept>
#include <string>

namespace bsjit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace bsjit
