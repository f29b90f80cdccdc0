// Every kernel the library can emit, compiled, with a hash of each binary: the refactor check.
// Two trees whose lines are equal (`diff`) build the same kernels, byte for byte.
#pragma once

#include <string>
#include <vector>

namespace bsjit::tools {

// One line per kernel variant, sorted: "<what> <arch> <XXH3-64 of the cubin>" (or "... ERROR:
// <message>" where it does not compile). The variants: every matmul op, block (8-128), dtype,
// feature axis, tile candidate and kernel kind (plain and general, small batch, TF32) on two fixed
// layouts (one whose backward-weight schedule splits, one whose does not), and every attention
// configuration (forward, backward, decomposed ops: blocks, head dims, dtypes, orders, causal), for
// each of `archs`. NVRTC only: no GPU. Compiles on `threads` threads (0: one per core); variants
// whose source and entry point are the same share one compile. only: the variants whose name holds
// it (all: empty). About 6400 variants, 10 minutes on 2 cores.
std::vector<std::string> kernel_hashes(const std::vector<std::string>& archs, unsigned threads,
                                       const std::string& only = "");

}  // namespace bsjit::tools
