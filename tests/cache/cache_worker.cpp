// Helper process for the cache stress tests.
//   cache_worker precompile DIR SEED   4 threads precompile 6 overlapping ops (12 kernels) into DIR in a
//                                      seed-dependent order; prints "built N compiled M"
//   cache_worker churn DIR SEED        writes large entries with fake cubins derived from their key,
//                                      forever (the test kills it with SIGKILL mid-write)
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bsjit/bsjit.hpp"
#include "cache/kernel_cache.hpp"

using namespace bsjit;

// The cubin a churn entry must hold for its key: the check that a loaded entry is not another's.
std::vector<char> churn_cubin(const std::string& key, std::size_t size) {
  std::vector<char> c(size);
  std::uint64_t h = std::hash<std::string>{}(key);
  for (std::size_t i = 0; i < size; ++i) c[i] = static_cast<char>((h >> (8 * (i % 8))) + i / 8);
  return c;
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const std::string mode = argv[1], dir = argv[2];
  const unsigned seed = std::stoul(argv[3]);
  CacheConfig config;
  config.directory = dir;
  if (mode == "precompile") {
    configure_cache(config);
    std::vector<MatMul> kernels;
    for (int i = 0; i < 3; ++i) {
      Layout l = Layout::from_coords(4, 4, {{0, 0}, {i + 1, i}, {3, 3}});
      kernels.emplace_back(l, MatMulOptions{16, DType::bf16, FeatureAxis::last, ""});
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::mt19937 rng(seed * 10 + t);
        std::vector<int> order = {0, 1, 2, 3, 4, 5};
        std::shuffle(order.begin(), order.end(), rng);
        for (int k : order) kernels[k / 2].precompile(k % 2 ? Op::forward : Op::backward_weight, "sm_90", Calls::plain);
      });
    for (auto& t : threads) t.join();
    // entries built: compiled, or from the code of another layout of the shape; and those compiled
    std::printf("built %lld compiled %lld\n",
                static_cast<long long>(cache_stats().compiles + cache_stats().shared_compiles),
                static_cast<long long>(cache_stats().compiles));
    return 0;
  }
  if (mode == "churn") {
    cache::KernelCache cache(config);
    std::mt19937 rng(seed);
    for (std::uint64_t i = 0;; ++i) {
      std::string key = std::to_string(rng() % 64);  // overlapping keys: rewrites race with reads
      key.resize(32, 'k');
      std::size_t size = (1 + rng() % 4) << 20;
      cache::Request r{key, "churn", "sm_90", "layout", [&] {
                         runtime::CompiledKernel k;
                         k.cubin = churn_cubin(key, size);
                         k.lowered_name = "churn_" + key;
                         k.arch = "sm_90";
                         return k;
                       }};
      cache::KernelCache fresh(config);  // every round as a new process would: no memory hits
      fresh.get(r);
    }
  }
  return 2;
}
