// The kernel templates (templates/bsjit/*.cuh), embedded into the library at build time so the
// runtime never reads the source or install tree.
#pragma once

#include <string>
#include <vector>

namespace bsjit::generator {

struct EmbeddedTemplate {
  std::string include_name;  // as written in #include, e.g. "bsjit/matmul_fma.cuh"
  std::string contents;
};

const std::vector<EmbeddedTemplate>& embedded_templates();
// Hash of every template's name and contents: part of each cache key.
const std::string& templates_hash();

}  // namespace bsjit::generator
