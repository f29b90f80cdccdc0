# Writes a C++ file that holds every kernel template as a string literal, plus a hash of them all.
# Run at build time (cmake -P) with TEMPLATE_DIR, OUTPUT and TEMPLATES (list of paths relative to
# TEMPLATE_DIR, e.g. bsjit/matmul_fma.cuh).
set(body "")
set(all "")
foreach(name IN LISTS TEMPLATES)
  file(READ "${TEMPLATE_DIR}/${name}" text)
  string(APPEND all "${name}\n${text}\n")
  # Raw string literals are limited in length by some compilers; split into 8000-character pieces.
  string(LENGTH "${text}" len)
  set(pieces "")
  set(pos 0)
  while(pos LESS len)
    string(SUBSTRING "${text}" ${pos} 8000 piece)
    string(APPEND pieces "R\"bsjit_tpl(${piece})bsjit_tpl\"\n")
    math(EXPR pos "${pos} + 8000")
  endwhile()
  string(APPEND body "    {\"${name}\", std::string(\n${pieces})},\n")
endforeach()
string(SHA256 hash "${all}")
file(WRITE "${OUTPUT}.tmp" "// Generated from templates/ by cmake/embed_templates.cmake. Do not edit.
#include \"templates.hpp\"

namespace bsjit::generator {

const std::vector<EmbeddedTemplate>& embedded_templates() {
  static const std::vector<EmbeddedTemplate> kTemplates = {
${body}  };
  return kTemplates;
}

const std::string& templates_hash() {
  static const std::string kHash = \"${hash}\";
  return kHash;
}

}  // namespace bsjit::generator
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
