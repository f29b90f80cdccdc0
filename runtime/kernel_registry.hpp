// The process-wide registry of kernels ready to launch: generated source and compiled binary per
// kernel id, while someone holds them. MatMul objects hold the kernels of their layout, loaded
// through SharedKernels, and let them go with themselves, so that a training job whose sparsity
// changes (a MatMul per new layout) keeps a bounded memory on the host and the GPU. Warm-up pins
// what it loads for the life of the process, so a kernel warmed up at start costs a later MatMul
// nothing but map lookups.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bsjit/matmul.hpp"
#include "cache/kernel_cache.hpp"
#include "generator/matmul_generator.hpp"
#include "module.hpp"

namespace bsjit::runtime {

struct KernelId {
  std::string layout_hash;
  generator::MatMulSpec spec;
  std::string arch;
  auto key() const {
    return std::make_tuple(layout_hash, spec.op, spec.block, spec.dtype, spec.feature_axis, spec.wgmma,
                           spec.small_batch, spec.tf32, spec.plain, spec.sms, arch,
                           spec.tiles ? generator::tiles_tag(*spec.tiles) : std::string());
  }
  bool operator<(const KernelId& o) const { return key() < o.key(); }
};

struct PreparedKernel {
  generator::GeneratedSource generated;
  std::string key;
  cache::KernelCache::Compiled compiled;
};

// The cache request for a generated kernel: compiles it for arch with NVRTC on a miss, or takes the
// code of a kernel of identical source (another layout of the shape) that the cache holds.
cache::Request cache_request(const generator::GeneratedSource& g, const std::string& key, const std::string& arch,
                             const std::string& layout_hash);

// Grid, block and shared memory of a launch of kernel over n rows. Throws Error when n needs more
// row tiles than a grid holds.
LaunchShape launch_shape(const PreparedKernel& kernel, Op op, std::int64_t n);

// The grid of a launch of kernel over n rows in ctx: launch_shape's, or for a persistent kernel as
// many CTAs as the GPU holds (at most its tiles).
LaunchShape launch_shape(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op, std::int64_t n);

// The workspace bytes a launch of kernel over n rows needs: the generator's workspace_bytes, or 0
// for a paced kernel (kernels::WaveGate) that needs the workspace for nothing else and whose CTAs
// have too few rounds at n for the gate to wait (as the kernel counts them).
std::size_t workspace_bytes(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op,
                            std::int64_t n);

// Launches kernel (its function in ctx, the current context) over n rows on stream: the grid of
// launch_shape (nothing when it is empty), and for TMA kernels the tensor maps of args' operands.
void launch_prepared(const PreparedKernel& kernel, CUfunction function, const Context& ctx, Op op, std::int64_t n,
                     CUstream stream, KernelArgs& args);

// Tuning records: which tile shape a (layout, op, block, dtype, feature axis, arch) uses at a batch
// class (generator::variants index). tuning_key names the record.
// resolve_spec: the spec to compile for arch: with the arch's instructions (wgmma on sm_90a) and
// the tuned tile shape where a record exists and is valid for spec, else the generator's choice.
std::string tuning_key(const std::string& layout_hash, const generator::MatMulSpec& spec, const std::string& arch,
                       int variant);
generator::MatMulSpec resolve_spec(const std::string& layout_hash, generator::MatMulSpec spec, const std::string& arch,
                                 int variant);
void store_tuning(const std::string& layout_hash, const generator::MatMulSpec& spec, const std::string& arch, int variant,
                  const generator::TileConfig& tiles);

// The specs of op's batch variants (generator::variants) for a MatMul of these options.
std::vector<generator::MatMulSpec> op_variants(Op op, const MatMulOptions& options);
// The spec of a call's kernel: variants[v] (op_variants), plain or general, for arch (and sms SMs
// where sms > 0, else the variant's count), with its tuned tile shape (resolve_spec).
generator::MatMulSpec call_spec(const std::string& layout_hash, const std::vector<generator::MatMulSpec>& variants,
                                int v, bool plain, const std::string& arch, int sms = 0);
// Whether a call with these options runs the plain kernel (MatMulSpec::plain).
inline bool plain_call(const OpOptions& call) { return !call.accumulate && call.gate == nullptr; }
// The kernels `calls` names, as MatMulSpec::plain values: the plain one first.
std::vector<bool> plain_kinds(Calls calls);

class KernelRegistry {
 public:
  // Generates the kernel's source and gets its binary from the cache (memory, disk, or NVRTC unless
  // on_miss is fail). *compiled_now tells whether NVRTC ran in this call. While someone holds the
  // returned kernel, a prepare of the same id returns it; once nobody does, it is gone from here,
  // and the next prepare generates the source again (the binary comes from the cache).
  std::shared_ptr<const PreparedKernel> prepare(const Layout& layout, const KernelId& id, cache::OnMiss on_miss,
                                                bool* compiled_now = nullptr);

  // prepare() of every (layout, id) on all cores, one kernel per core at a time (NVRTC runs
  // single-threaded): [i] is kernels[i]'s. Throws the first failure (by index) once all have ended.
  // (*compiled_now)[i], where given (sized as kernels), is 1 when NVRTC ran for kernels[i].
  std::vector<std::shared_ptr<const PreparedKernel>> prepare_all(
      const std::vector<std::pair<const Layout*, KernelId>>& kernels, cache::OnMiss on_miss,
      std::vector<char>* compiled_now = nullptr);

  // *prepared (id's) loaded into ctx by load_or_rebuild: where its code is compiled again, *prepared
  // becomes a kernel holding the new code, and later prepares of id return that one.
  SharedKernels::Handle load(const KernelId& id, std::shared_ptr<const PreparedKernel>* prepared, const Context& ctx,
                             cache::OnMiss on_miss);

  // Loads kernel into ctx (SharedKernels: the one loaded there already, if any) and keeps it loaded,
  // with `prepared` when given, for the life of the process (deploy's warm-up): a later MatMul of
  // the kernel finds both without generating or loading anything. Returns its function.
  CUfunction pin(const cache::KernelCache::Compiled& kernel, const Context& ctx,
                 std::shared_ptr<const PreparedKernel> prepared = nullptr);
  // The same for id's prepared kernel, loaded by load() (its code compiled again where the driver
  // refuses it).
  CUfunction pin(const KernelId& id, std::shared_ptr<const PreparedKernel> prepared, const Context& ctx,
                 cache::OnMiss on_miss);

  // Kernel ids the registry keeps a slot for: those held, and those released since its last sweep
  // (tests, diagnostics).
  std::size_t slots();

  static KernelRegistry& global();

 private:
  struct Slot {
    std::mutex mutex;
    std::weak_ptr<const PreparedKernel> prepared;
  };
  struct Pinned {
    SharedKernels::Handle loaded;
    std::shared_ptr<const PreparedKernel> prepared;
  };
  std::mutex mutex_;
  std::map<KernelId, std::shared_ptr<Slot>> prepared_;
  std::size_t sweep_at_ = 64;  // prepared_'s size at which the next prepare forgets released ids
  std::map<std::pair<const CompiledKernel*, Context>, Pinned> pinned_;
};

}  // namespace bsjit::runtime
