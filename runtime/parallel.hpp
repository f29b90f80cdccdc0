// Work spread over the cores: what compiling many kernels at once needs (NVRTC compiles one
// kernel on one thread, for a second or two).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace bsjit::runtime {

// Calls fn(i) for every i in [0, n) on `threads` threads (0: one per core, never more than n), each
// taking the next index as it finishes one. fn must not throw (catch and record inside it).
template <class F>
void parallel_for(std::size_t n, unsigned threads, F fn) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(n, 1)));
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (std::size_t i; (i = next++) < n;) fn(i);
    });
  for (auto& t : pool) t.join();
}

}  // namespace bsjit::runtime
