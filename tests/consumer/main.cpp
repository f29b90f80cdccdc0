// Uses only the installed public headers: builds a layout, generates and compiles a kernel for
// sm_90 without a GPU, and prints the layout's hash.
#include <bsjit/bsjit.hpp>

#include <cstdio>

int main() {
  try {
    bsjit::set_cache_directory({});
    bsjit::Layout layout = bsjit::Layout::from_coords(4, 4, {{0, 0}, {1, 2}, {3, 3}});
    bsjit::MatMul mm(layout, {.block = 32, .dtype = bsjit::DType::bf16});
    bool compiled = mm.precompile(bsjit::Op::forward, "sm_90");
    std::printf("consumer: layout %s, %lld blocks, compiled %d\n", layout.hash().hex().c_str(),
                static_cast<long long>(layout.blocks()), compiled ? 1 : 0);
    return compiled ? 0 : 1;
  } catch (const bsjit::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
