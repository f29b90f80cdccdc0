// bsjit-bench (also `bsjit bench`): the benchmark suites of ../shared/BENCH.md, measured in one
// process together with their baselines.
//   --suite W      weight-sparse matmul: N=8192, C=K=4096, bf16, b ∈ {16,32,64,128},
//                  d ∈ {0.5,0.25,0.1,0.05}, balanced and Bernoulli layouts; the three ops
//   --suite small  N=64, C=K=16384, b ∈ {32,64}, d=0.1 (bandwidth-bound on W)
//   --suite tf32   suite W's shape (balanced) with fp32 inputs: exact and TF32, against cuBLAS fp32 and TF32
//   --suite jit    cold compile by layout size, disk hit in a fresh cache, host overhead per call
//   --suite A      block-sparse attention: fused forward and backward, decomposed forward (suite_a.hpp)
//   --suite layers suite W's cells on other layers: larger and rectangular C × K, power-law and
//                  small-world columns, N from 1024 to 32768 (default_layer_classes; --layers picks)
//   --suite C      block-sparse 2-D convolution against cuDNN's dense and grouped ones (suite_c.hpp)
// Each result is checked once against a double-precision reference on sampled rows or blocks
// before it is timed; times are medians of CUDA-event timings after warm-up.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <tuple>

#include "baselines.hpp"
#include "bsjit/bsjit.hpp"
#include "cache/kernel_cache.hpp"
#include "device_buffer.hpp"
#include "generator/attention_generator.hpp"
#include "reference.hpp"
#include "runtime/attention_common.hpp"
#include "runtime/compiler.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/module.hpp"
#include "runtime/parallel.hpp"
#include "suite_a.hpp"
#include "suite_c.hpp"
#include "suite_layouts.hpp"

namespace bsjit::bench {
namespace {

using tools::DeviceBuffer;
using Clock = std::chrono::steady_clock;

// --- data ------------------------------------------------------------------------------------

// Random bf16 in [-1, 1): bits on the host (for upload) and values (for the reference).
struct HostBf16 {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};
HostBf16 random_bf16(std::size_t count, std::uint64_t seed) {
  HostBf16 h;
  h.bits.resize(count);
  h.values.resize(count);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < count; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float f = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    h.bits[i] = static_cast<std::uint16_t>(u >> 16);
    std::uint32_t back = static_cast<std::uint32_t>(h.bits[i]) << 16;
    std::memcpy(&h.values[i], &back, 4);
  }
  return h;
}

// Random fp32 in [-1, 1) with all 23 bits of mantissa in play (TF32 keeps 10 of them).
std::vector<float> random_f32(std::size_t count, std::uint64_t seed) {
  std::vector<float> v(count);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& f : v) f = u(rng);
  return v;
}

float bf16_value(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// --- sampled reference check -----------------------------------------------------------------

// Normwise relative error of op's output on a sample: 16 rows of N (forward, backward-data) or
// 4 blocks (backward-weight), against a double-precision sum over the layout's blocks.
// x, w, dy: the inputs' values; got(i): element i of the output.
double sampled_error(const Layout& L, int b, std::int64_t n, Op op, const std::vector<float>& x,
                     const std::vector<float>& w, const std::vector<float>& dy,
                     const std::function<double(std::int64_t)>& got) {
  const std::int64_t C = L.rows() * b, K = L.cols() * b;
  double max_diff = 0, max_ref = 0;
  auto cmp = [&](double ref, std::int64_t i) {
    const double g = got(i);
    if (!std::isfinite(g)) max_diff = INFINITY;
    max_diff = std::max(max_diff, std::abs(g - ref));
    max_ref = std::max(max_ref, std::abs(ref));
  };
  std::mt19937_64 rng(7);
  if (op == Op::backward_weight) {
    for (int s = 0; s < 4 && L.blocks() > 0; ++s) {
      std::int64_t blk = rng() % L.blocks();
      auto [r, c] = L.block_coord(blk);
      std::vector<double> acc(b * b, 0.0);
      for (std::int64_t m = 0; m < n; ++m)
        for (int i = 0; i < b; ++i) {
          double xv = x[m * C + r * b + i];
          const float* d = &dy[m * K + c * b];
          for (int j = 0; j < b; ++j) acc[i * b + j] += xv * d[j];
        }
      for (int e = 0; e < b * b; ++e) cmp(acc[e], blk * b * b + e);
    }
  } else {
    const bool fwd = op == Op::forward;
    const std::int64_t in = fwd ? C : K, outf = fwd ? K : C;
    const std::vector<float>& a = fwd ? x : dy;
    for (int s = 0; s < 16; ++s) {
      std::int64_t m = rng() % n;
      std::vector<double> row(outf, 0.0);
      for (std::int64_t blk = 0; blk < L.blocks(); ++blk) {
        auto [r, c] = L.block_coord(blk);
        const float* wb = &w[blk * b * b];
        for (int i = 0; i < b; ++i)
          for (int j = 0; j < b; ++j) {
            if (fwd)
              row[c * b + j] += static_cast<double>(a[m * in + r * b + i]) * wb[i * b + j];
            else
              row[r * b + i] += static_cast<double>(a[m * in + c * b + j]) * wb[i * b + j];
          }
      }
      for (std::int64_t f = 0; f < outf; ++f) cmp(row[f], m * outf + f);
    }
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// sampled_error of a bf16 output on bf16 inputs.
double sampled_error(const Layout& L, int b, std::int64_t n, Op op, const HostBf16& x, const HostBf16& w,
                     const HostBf16& dy, const DeviceBuffer& out) {
  const auto bits = out.download<std::uint16_t>();
  return sampled_error(L, b, n, op, x.values, w.values, dy.values,
                       [&](std::int64_t i) { return static_cast<double>(bf16_value(bits[i])); });
}

// --- suite W ---------------------------------------------------------------------------------

struct Row {
  std::string layout;
  int b;
  double d;
  std::string op;
  double ms, tflops, sol, vs_cublas, vs_cusparse, error, floor_ms;
  // cuBLAS's time for the dense GEMM that does the op's work: as many FLOPs, outputs and the same
  // reduction length per output (dense_equivalent) over ours; below 1 where cuBLAS is faster
  double vs_dense_eq = NAN;
};

struct Env {
  CUstream stream;
  int reps;
  double copy_bw;  // bytes/s
  std::vector<std::string> ops;  // the ops the sweeps time
  std::vector<std::string> tiles;  // the sweeps time only tile shapes whose tags start with one of these (all: empty)
};

const Op kOps[] = {Op::forward, Op::backward_data, Op::backward_weight};

// Every op's kernel of each MatMul compiled on all cores before the first is timed: compiled at
// their first calls, one at a time, they took most of the suite's time on the device. The suites
// call without OpOptions: the plain kernels.
void precompile_ops(const std::vector<const MatMul*>& mms) {
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(runtime::current_context()));
  runtime::parallel_for(mms.size() * 3, 0, [&](std::size_t i) {
    try {
      mms[i / 3]->precompile(kOps[i % 3], arch, Calls::plain);
    } catch (const std::exception&) {  // reported by the op's call
    }
  });
}

// The device operands of one shape: X and dY in, Y and dX out (W and dW are per cell).
struct Operands {
  DeviceBuffer x, dy, y, dx;
};

// op on mm (forward X·W → Y, backward-data dY·Wᵀ → dX, backward-weight Xᵀ·dY → dW) and the buffer it
// writes.
std::pair<std::function<void()>, DeviceBuffer*> op_call(const MatMul& mm, Op op, Operands& o, const DeviceBuffer& w,
                                                        DeviceBuffer& dw, std::int64_t n, CUstream stream) {
  if (op == Op::forward) return {[&, n, stream] { mm.forward(o.x.get(), w.get(), o.y.get(), n, stream); }, &o.y};
  if (op == Op::backward_data)
    return {[&, n, stream] { mm.backward_data(o.dy.get(), w.get(), o.dx.get(), n, stream); }, &o.dx};
  return {[&, n, stream] { mm.backward_weight(o.x.get(), o.dy.get(), dw.get(), n, stream); }, &dw};
}

struct Measured {
  double error, ms;
};

// Runs `call` once into `out` poisoned with 0xff bytes (NaN in every dtype), takes error() of what it
// wrote, then times it.
Measured check_then_time(const Env& env, const std::function<void()>& call, DeviceBuffer& out,
                         const std::function<double()>& error) {
  BSJIT_CU(runtime::driver().cuMemsetD8(out.ptr, 0xff, out.bytes));
  call();
  BSJIT_CU(runtime::driver().cuStreamSynchronize(env.stream));
  const double err = error();
  return {err, time_ms(call, env.stream, 3, env.reps)};
}

// The dense GEMM that does an op's work on L with block b at batch N, as cuBLAS's (n, c, k): the
// same FLOPs, the same output and the mean reduction length of an output, C' = blocks · b / columns
// (on suite W's balanced layouts every forward output column's, exactly). Forward and
// backward-data: Y[N, K] = X[N, C'] · W[C', K]; backward-weight: dW's blocks as a [C', K] output
// with reduction N. It moves less than the sparse op (X's C' columns instead of all of them, no
// index reads), so it is an optimistic reference, most of all at low density: a cell whose SOL
// target asks more than this GEMM reaches asks more than cuBLAS does with the same work.
struct DenseEquivalent {
  std::int64_t n, c, k;
};
DenseEquivalent dense_equivalent(const Layout& L, int b, std::int64_t N, Op op) {
  const std::int64_t K = L.cols() * b;
  std::int64_t reduction = (L.blocks() * b + L.cols() / 2) / L.cols();
  reduction = std::max<std::int64_t>(8, (reduction + 4) / 8 * 8);  // whole 16-byte rows for cuBLAS's fast kernels
  return op == Op::backward_weight ? DenseEquivalent{reduction, N, K} : DenseEquivalent{N, reduction, K};
}

// One cell of a table: a layout at block b (density d as asked), its label the table's layout column.
struct CellSpec {
  std::string label;
  int b;
  double d;
  Layout layout;
};

// The cells' three ops at batch N on X [N, C], dY [N, K] (every cell's layout C / b × K / b), each
// checked then timed beside cuBLAS's dense GEMM of the same shape, cuSPARSE and the cell's dense
// equivalent. small: SOL as the fraction of copy bandwidth on W's bytes (the small batch).
void run_cells(const Env& env, std::int64_t N, std::int64_t C, std::int64_t K, const std::vector<CellSpec>& specs,
               std::vector<Row>& rows, bool small) {
  const double t_dense = cublas_dense_ms(N, C, K, Dense::bf16, env.stream, env.reps);
  fmt::print("cuBLAS dense bf16 N={} C={} K={}: {:.4f} ms, {:.0f} TFLOP/s\n", N, C, K, t_dense,
             2.0 * N * C * K / t_dense / 1e9);
  HostBf16 x = random_bf16(N * C, 1), dy = random_bf16(N * K, 2);
  Operands o{DeviceBuffer(N * C * 2), DeviceBuffer(N * K * 2), DeviceBuffer(N * K * 2), DeviceBuffer(N * C * 2)};
  o.x.upload(x.bits);
  o.dy.upload(dy.bits);
  struct Cell {
    std::string kind;
    int b;
    double d;
    MatMul mm;
  };
  std::vector<Cell> cells;
  for (const CellSpec& spec : specs)
    cells.push_back({spec.label, spec.b, spec.d, MatMul(spec.layout, {spec.b, DType::bf16, FeatureAxis::last, ""})});
  std::vector<const MatMul*> mms;
  for (const Cell& cell : cells) mms.push_back(&cell.mm);
  precompile_ops(mms);
  for (const Cell& cell : cells) {
    const std::string& kind = cell.kind;
    const int b = cell.b;
    const double d = cell.d;
    const MatMul& mm = cell.mm;
    const Layout& L = mm.layout();
    const double d_eff = static_cast<double>(L.blocks()) / (L.rows() * L.cols());
    HostBf16 w = random_bf16(L.blocks() * b * b, 3 + b);
    DeviceBuffer dw_in(w.bits.size() * 2), dw_out(w.bits.size() * 2);
    dw_in.upload(w.bits);
    const double flops = 2.0 * N * L.blocks() * b * b;
    const double bytes = 2.0 * (N * C + N * K + L.blocks() * b * b);
    const double floor_ms = std::max(d_eff * t_dense, bytes / env.copy_bw * 1e3);
    double t_sparse = cusparse_bell_ms(L, b, N, o.x.get(), o.y.get(), env.stream, env.reps);
    // forward and backward-data share their dense equivalent's shape
    const auto dense_eq_ms = [&](Op op) {
      const DenseEquivalent eq = dense_equivalent(L, b, N, op);
      return cublas_dense_ms(eq.n, eq.c, eq.k, Dense::bf16, env.stream, env.reps);
    };
    const double t_eq_data = dense_eq_ms(Op::forward), t_eq_weight = dense_eq_ms(Op::backward_weight);
    for (Op op : kOps) {
      const double t_eq = op == Op::backward_weight ? t_eq_weight : t_eq_data;
      auto [call, out] = op_call(mm, op, o, dw_in, dw_out, N, env.stream);
      const auto [err, ms] =
          check_then_time(env, call, *out, [&, out = out] { return sampled_error(L, b, N, op, x, w, dy, *out); });
      Row r{kind,
            b,
            d,
            std::string(to_string(op)),
            ms,
            flops / ms / 1e9,
            floor_ms / ms,
            t_dense / ms,
            op == Op::forward && t_sparse > 0 ? t_sparse / ms : NAN,
            err,
            floor_ms,
            t_eq / ms};
      if (small) r.sol = (L.blocks() * b * b * 2.0 / (ms * 1e-3)) / env.copy_bw;  // fraction of copy bw on W
      rows.push_back(r);
      fmt::print("{:8} b{:<3} d{:<5} {:15} {:8.4f} ms {:6.1f} TF/s  {}{:.2f}  x{:.2f} cuBLAS  x{:.2f} dense-eq({:.4f} ms)  {}  err {:.1e}{}\n",
                 kind, b, d, r.op, ms, r.tflops, small ? "W-bw " : "SOL ", r.sol, r.vs_cublas, r.vs_dense_eq, t_eq,
                 std::isnan(r.vs_cusparse) ? std::string("")
                                           : fmt::format("x{:.2f} cuSPARSE({:.3f} ms)", r.vs_cusparse, t_sparse),
                 err, err > 1e-2 ? "  WRONG" : "");
      std::fflush(stdout);
    }
  }
}

// Suite W (and the small batch): the cells `selected` of `table` at N, C = K = CK, each layout the
// one the whole table draws for it (table_layouts).
void run_w(const Env& env, std::int64_t N, std::int64_t CK, const Grid& table, const Grid& selected,
           std::vector<Row>& rows, bool small) {
  const std::vector<Layout> layouts = table_layouts(CK, table, selected);
  std::vector<CellSpec> specs;
  for (const auto& kind : selected.kinds)
    for (int b : selected.blocks)
      for (double d : selected.densities) specs.push_back({kind, b, d, layouts[specs.size()]});
  run_cells(env, N, CK, CK, specs, rows, small);
}

// The layers suite: every class at each (block, density), classes of one shape and N together;
// cells whose block does not divide the class's features are skipped with a line.
void run_layers(const Env& env, const std::vector<LayerClass>& classes, const std::vector<int>& blocks,
                const std::vector<double>& densities, std::vector<Row>& rows) {
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<CellSpec>> by_shape;
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> order;
  for (const LayerClass& layer : classes)
    for (int b : blocks)
      for (double d : densities) {
        if (layer.c % b != 0 || layer.k % b != 0) {
          fmt::print("{} b{}: block does not divide the features; skipped\n", to_string(layer), b);
          continue;
        }
        const auto shape = std::tuple{layer.n, layer.c, layer.k};
        if (!by_shape.count(shape)) order.push_back(shape);
        by_shape[shape].push_back({to_string(layer), b, d, layer_layout(layer, b, d)});
      }
  for (const auto& shape : order) {
    const auto [n, c, k] = shape;
    run_cells(env, n, c, k, by_shape[shape], rows, false);
  }
}

// --- fp32 and TF32 ----------------------------------------------------------------------------

// Suite W's shape with fp32 inputs, each cell twice: exact fp32 (the default) and MatMulOptions::tf32,
// against cuBLAS's fp32 GEMM (exact) and its TF32 GEMM (CUBLAS_COMPUTE_32F_FAST_TF32) in the same run.
// Rows' layout column: "f32" or "tf32"; SOL and the cuBLAS ratio are against the matching GEMM.
void run_tf32(const Env& env, const std::vector<int>& blocks, const std::vector<double>& densities,
              std::vector<Row>& rows) {
  const std::int64_t N = 8192, C = 4096, K = 4096;
  const double t_f32 = cublas_dense_ms(N, C, K, Dense::f32, env.stream, env.reps);
  const double t_tf32 = cublas_dense_ms(N, C, K, Dense::tf32, env.stream, env.reps);
  for (auto [name, t] : {std::pair{"fp32", t_f32}, std::pair{"TF32", t_tf32}})
    fmt::print("cuBLAS dense {} N={} C={} K={}: {:.4f} ms, {:.0f} TFLOP/s\n", name, N, C, K, t,
               2.0 * N * C * K / t / 1e9);
  const std::vector<float> x = random_f32(N * C, 1), dy = random_f32(N * K, 2);
  Operands o{DeviceBuffer(N * C * 4), DeviceBuffer(N * K * 4), DeviceBuffer(N * K * 4), DeviceBuffer(N * C * 4)};
  o.x.upload(x);
  o.dy.upload(dy);
  {  // cuBLAS's own error on these inputs and a dense W, the layout of one block of C × K
    const std::vector<float> w = random_f32(C * K, 3);
    DeviceBuffer dw(C * K * 4);
    dw.upload(w);
    const Layout dense = Layout::from_coords(1, 1, {{0, 0}});
    for (bool tf32 : {false, true}) {
      BSJIT_CU(runtime::driver().cuMemsetD8(o.y.ptr, 0xff, o.y.bytes));
      cublas_gemm_f32(static_cast<const float*>(o.x.get()), static_cast<const float*>(dw.get()),
                      static_cast<float*>(o.y.get()), N, C, K, tf32, env.stream);
      BSJIT_CU(runtime::driver().cuStreamSynchronize(env.stream));
      const auto got = o.y.download<float>();
      fmt::print("cuBLAS dense {}: error {:.1e}\n", tf32 ? "TF32" : "fp32",
                 sampled_error(dense, static_cast<int>(C), N, Op::forward, x, w, dy,
                               [&](std::int64_t i) { return double(got[i]); }));
    }
  }
  struct Cell {
    int b;
    double d;
    bool tf32;
    MatMul mm;
  };
  std::vector<Cell> cells;
  std::mt19937_64 rng(42);
  for (int b : blocks) {
    if (b < 16) continue;  // TF32 needs block ≥ 16
    for (double d : densities) {
      const Layout L = balanced_layout(C / b, K / b, d, rng);
      for (bool tf32 : {false, true})
        cells.push_back({b, d, tf32, MatMul(L, {b, DType::f32, FeatureAxis::last, "", tf32})});
    }
  }
  std::vector<const MatMul*> mms;
  for (const Cell& cell : cells) mms.push_back(&cell.mm);
  precompile_ops(mms);
  for (const Cell& cell : cells) {
    const Layout& L = cell.mm.layout();
    const int b = cell.b;
    const std::vector<float> w = random_f32(L.blocks() * b * b, 3 + b);
    DeviceBuffer dw_in(w.size() * 4), dw_out(w.size() * 4);
    dw_in.upload(w);
    const double t_dense = cell.tf32 ? t_tf32 : t_f32;
    const double d_eff = static_cast<double>(L.blocks()) / (L.rows() * L.cols());
    const double flops = 2.0 * N * L.blocks() * b * b;
    const double floor_ms = std::max(d_eff * t_dense, 4.0 * (N * C + N * K + L.blocks() * b * b) / env.copy_bw * 1e3);
    const double tolerance = cell.tf32 ? 1e-2 : 1e-5;
    for (Op op : kOps) {
      auto [call, out] = op_call(cell.mm, op, o, dw_in, dw_out, N, env.stream);
      const auto [err, ms] = check_then_time(env, call, *out, [&, out = out] {
        const auto got = out->download<float>();
        return sampled_error(L, b, N, op, x, w, dy, [&](std::int64_t i) { return double(got[i]); });
      });
      Row r{cell.tf32 ? "tf32" : "f32",
            b,
            cell.d,
            std::string(to_string(op)),
            ms,
            flops / ms / 1e9,
            floor_ms / ms,
            t_dense / ms,
            NAN,
            err,
            floor_ms};
      rows.push_back(r);
      fmt::print("{:5} b{:<3} d{:<5} {:15} {:8.4f} ms {:6.1f} TF/s  SOL {:.2f}  x{:.2f} cuBLAS {}  err {:.1e}{}\n",
                 r.layout, b, cell.d, r.op, ms, r.tflops, r.sol, r.vs_cublas, cell.tf32 ? "TF32" : "fp32", err,
                 err > tolerance ? "  WRONG" : "");
      std::fflush(stdout);
    }
  }
}

// --- tile sweep ------------------------------------------------------------------------------

// Every tile candidate of each op for the given cases: checked once, timed, best marked. What the
// autotuner will choose from; the results decide the heuristic's defaults.
void run_sweep(const Env& env, std::int64_t N, std::int64_t CK, const std::vector<std::string>& kinds,
               const std::vector<int>& blocks, const std::vector<double>& densities, nlohmann::json& out) {
  const std::int64_t C = CK, K = CK;
  HostBf16 x = random_bf16(N * C, 1), dy = random_bf16(N * K, 2);
  DeviceBuffer dx_in(N * C * 2), ddy(N * K * 2), dy_out(N * K * 2), dx_out(N * C * 2);
  dx_in.upload(x.bits);
  ddy.upload(dy.bits);
  const Grid cells{kinds, blocks, densities};
  const std::vector<Layout> layouts = table_layouts(CK, cells, cells);  // in the cells' order
  const runtime::Context ctx = runtime::current_context();
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(ctx));
  // every tile candidate of the selected ops on one cell's layout
  auto sweep_cell = [&](const std::string& kind, int b, double d, const Layout& L) {
    HostBf16 w = random_bf16(L.blocks() * b * b, 3 + b);
    DeviceBuffer dw_in(w.bits.size() * 2), dw_out(w.bits.size() * 2);
    dw_in.upload(w.bits);
    const double flops = 2.0 * N * L.blocks() * b * b;
    // compile every candidate of the three ops in parallel first
    std::vector<runtime::KernelId> ids;
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
      if (std::find(env.ops.begin(), env.ops.end(), std::string(to_string(op))) == env.ops.end()) continue;
      generator::MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = generator::has_wgmma(arch);
      spec.small_batch = N <= generator::kSmallBatchRows;  // sweep-small: the small batch's shapes too
      spec.plain = true;                                   // timed without OpOptions
      for (const auto& t : generator::tile_candidates(spec)) {
        const std::string tag = generator::tiles_tag(t);
        if (!env.tiles.empty() && std::none_of(env.tiles.begin(), env.tiles.end(),
                                               [&](const std::string& p) { return tag.rfind(p, 0) == 0; }))
          continue;
        spec.tiles = t;
        ids.push_back({L.hash().hex(), spec, arch});
      }
    }
    std::vector<std::pair<const Layout*, runtime::KernelId>> kernels;
    for (const auto& id : ids) kernels.push_back({&L, id});
    const auto prepared = runtime::KernelRegistry::global().prepare_all(kernels, cache::OnMiss::compile);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const Op op = ids[i].spec.op;
      const auto& p = prepared[i];
      const auto loaded = runtime::SharedKernels::global().acquire(p->compiled, ctx);  // for this timing
      CUfunction f = loaded->function;
      DeviceBuffer& o = op == Op::forward ? dy_out : op == Op::backward_data ? dx_out : dw_out;
      runtime::KernelArgs args{op == Op::backward_data ? ddy.get() : dx_in.get(),
                               op == Op::backward_weight ? ddy.get() : dw_in.get(),
                               o.get(),
                               nullptr,
                               static_cast<int>(N),
                               0,
                               nullptr};
      std::unique_ptr<DeviceBuffer> ws;
      if (p->generated.workspace_bytes > 0) {
        ws = std::make_unique<DeviceBuffer>(p->generated.workspace_bytes);
        BSJIT_CU(runtime::driver().cuMemsetD8(ws->ptr, 0, ws->bytes));
        args.workspace = static_cast<float*>(ws->get());
      }
      const auto [err, ms] = check_then_time(
          env, [&] { runtime::launch_prepared(*p, f, ctx, op, N, env.stream, args); }, o,
          [&] { return sampled_error(L, b, N, op, x, w, dy, o); });
      std::string tag = generator::tiles_tag(*ids[i].spec.tiles);
      fmt::print("sweep {:9} b{:<3} d{:<5} {:15} {:22} {:8.4f} ms {:6.1f} TF/s  smem {:6}  units {:5}  err {:.1e}{}\n",
                 kind, b, d, to_string(op), tag, ms, flops / ms / 1e9, p->generated.shared_bytes, p->generated.grid_x,
                 err, err > 1e-2 ? "  WRONG" : "");
      std::fflush(stdout);
      out.push_back({{"layout", kind},
                     {"block", b},
                     {"density", d},
                     {"op", to_string(op)},
                     {"tiles", tag},
                     {"ms", ms},
                     {"tflops", flops / ms / 1e9},
                     {"error", err}});
    }
  };
  std::size_t next = 0;
  for (const auto& kind : kinds)
    for (int b : blocks)
      for (double d : densities) sweep_cell(kind, b, d, layouts[next++]);
}

// --- JIT figures -----------------------------------------------------------------------------

// Cold compiles by layout size (memory-only cache, a fresh layout each time). Needs no GPU. Every
// compile bypasses the driver's cache, which NVRTC consults where a driver is installed: there the
// second of three compiles of one source took 35-50 ms instead of 0.2-1.6 s (runtime/compiler.hpp).
void run_compile(std::vector<std::pair<std::string, double>>& figures) {
  std::mt19937_64 rng(11);
  set_cache_directory({});  // the shared-code figures below go through the cache: memory only
  // the mma.sync kernel (b = 32, sm_90) and the Hopper ones (sm_90a: wgmma, TMA, mbarriers): b = 64
  // (swapped, and paired), the grouped kernel at b = 32, the tiled backward-weight, the row-grouped
  // backward-weight at b = 64 (and its row bands at b = 32) and the small-batch TMA kernel at b = 32. Shapes named,
  // so that the layout does not choose another kernel.
  generator::MatMulSpec hopper{Op::forward, 64, DType::bf16, FeatureAxis::last}, grouped = hopper, tiled = hopper;
  hopper.wgmma = grouped.wgmma = tiled.wgmma = true;
  grouped.block = tiled.block = 32;
  tiled.op = Op::backward_weight;
  generator::MatMulSpec small = grouped, paired = hopper, rows = hopper, bands = tiled;
  small.small_batch = true;
  generator::TileConfig pair, groups;
  pair.paired = true, pair.bm = 256, pair.warps_m = 2, pair.stages = 4;
  paired.tiles = pair;
  groups.wgmma = groups.tma = groups.staged = true, groups.row_blocks = 4, groups.warps_m = 1, groups.stages = 4;
  rows.op = Op::backward_weight;
  rows.tiles = groups;
  groups.row_blocks = 16, groups.warps_m = 2, groups.stages = 3;  // b = 32: 64 rows × 512 columns, no room to stage
  groups.staged = false;
  bands.tiles = groups;
  for (auto* spec : {&hopper, &grouped, &tiled, &small, &rows, &bands}) spec->tiles = generator::choose_tiles(*spec);
  // What a layout change costs the generator before any compile or load: each op's kernel chosen,
  // its tables and source generated, for a 4096 × 4096 layer (Bernoulli, d = 0.25), a fresh layout
  // each time.
  for (int b : {32, 64})
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
      generator::MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = spec.plain = true;
      std::vector<double> ms;
      std::string label;
      for (int draw = 0; draw < 5; ++draw) {
        const Layout L = bernoulli_layout(4096 / b, 4096 / b, 0.25, rng);
        const auto t = Clock::now();
        label = generator::generate_matmul(L, spec).label;
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      }
      std::sort(ms.begin(), ms.end());
      figures.emplace_back(fmt::format("generate a layout's tables and source, {} (median of 5), ms", label), ms[2]);
    }
  const std::pair<generator::MatMulSpec, std::string> kernels[] = {
      {{Op::forward, 32, DType::bf16, FeatureAxis::last}, "sm_90"},
      {hopper, "sm_90a"},
      {paired, "sm_90a"},
      {grouped, "sm_90a"},
      {tiled, "sm_90a"},
      {rows, "sm_90a"},
      {bands, "sm_90a"},
      {small, "sm_90a"}};
  // each kernel plain (the calls without OpOptions) at every size, and general at 4096 blocks. A
  // Hopper backward-weight kernel carries split support only where its layout splits on 132 SMs
  // (generator::sdd_kernel_planes), which takes it 150-340 ms longer to compile, and whether a
  // random layout splits is close to a coin toss: those kernels' figures are given apart for
  // layouts that split and for layouts taken whole (up to 3 of each among 30 draws).
  for (const auto& [general, arch] : kernels)
    for (const bool plain : {true, false})
      for (std::int64_t blocks : {64, 1024, 4096, 16384, 65536}) {
        if (!plain && blocks != 4096) continue;
        generator::MatMulSpec spec = general;
        spec.plain = plain;
        const bool by_split = spec.op == Op::backward_weight && spec.tiles && spec.tiles->tma;
        std::vector<double> ms[2];  // [split]: layouts taken whole, layouts that split
        for (int draw = 0; draw < (by_split ? 30 : 3) && (ms[0].size() < 3 || (by_split && ms[1].size() < 3)); ++draw) {
          const std::int64_t side = blocks <= 16384 ? 256 : 512;  // density ≤ 0.25: distinct random layouts
          Layout L = bernoulli_layout(side, side, static_cast<double>(blocks) / (side * side), rng);
          auto t = Clock::now();
          // one kernel (MatMul::precompile would also build the small-batch variant), generated and
          // compiled: not through the cache, where a layout of a shape compiled already shares its code
          const auto g = generator::generate_matmul(L, spec);
          auto& bucket = ms[by_split && g.workspace_bytes > 0 ? 1 : 0];
          if (bucket.size() == 3) continue;
          runtime::compile(g.source, g.name_expression, g.label, arch, runtime::DriverCache::bypass);
          bucket.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
        }
        for (int split = 0; split < 2; ++split) {
          if (ms[split].empty()) continue;
          std::sort(ms[split].begin(), ms[split].end());
          figures.emplace_back(fmt::format("cold compile, {} {}, {} blocks{} (median of {}), ms",
                                           generator::kernel_label(spec), arch, blocks,
                                           !by_split ? ""
                                           : split   ? ", layouts that split"
                                                     : ", layouts taken whole",
                                           ms[split].size()),
                               ms[split][ms[split].size() / 2]);
        }
      }
  // A layer's kernels, cold (a shape this process has not compiled, so no shared code): the three
  // ops' six kernels (both batch variants) by MatMul::precompile one op at a time, and of all three
  // at once, side by side on the cores.
  {
    const std::vector<Op> all{Op::forward, Op::backward_data, Op::backward_weight};
    std::vector<double> per_op, together;
    for (int rep = 0; rep < 3; ++rep)
      for (const bool at_once : {false, true}) {
        const std::int64_t side = 64 + 2 * rep + (at_once ? 1 : 0);
        const MatMul mm(balanced_layout(side, side, 0.25, rng), {64, DType::bf16, FeatureAxis::last, "sm_90a"});
        auto t = Clock::now();
        if (at_once)
          mm.precompile(all, "sm_90a", Calls::plain);
        else
          for (Op op : all) mm.precompile(op, "sm_90a", Calls::plain);
        (at_once ? together : per_op).push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      }
    std::sort(per_op.begin(), per_op.end());
    std::sort(together.begin(), together.end());
    figures.emplace_back(
        "a layer's plain kernels cold, b = 64 bf16 sm_90a (3 ops x 2 variants), one op at a time (median of 3), ms",
        per_op[1]);
    figures.emplace_back("a layer's kernels cold, all three ops at once (median of 3), ms", together[1]);
  }
  // A new layout of a compiled shape (a model's next layer, a changed sparsity pattern): the first
  // layout's columns rotated, built from its code with no NVRTC run (docs/CACHE.md).
  generator::MatMulSpec wide_dw{Op::backward_weight, 128, DType::bf16, FeatureAxis::last};
  wide_dw.wgmma = true;
  wide_dw.tiles = generator::choose_tiles(wide_dw);
  for (const auto& spec : {hopper, wide_dw}) {
    const Layout first = bernoulli_layout(512, 512, 0.25, rng);
    auto& registry = runtime::KernelRegistry::global();
    registry.prepare(first, {first.hash().hex(), spec, "sm_90a"}, cache::OnMiss::compile);
    std::vector<double> ms;
    for (int rotate = 1; rotate <= 3; ++rotate) {
      std::vector<std::pair<std::int64_t, std::int64_t>> moved;
      for (const auto& [r, c] : first.coords()) moved.push_back({r, (c + rotate) % first.cols()});
      const Layout next = Layout::from_coords(first.rows(), first.cols(), moved);
      const auto before = cache_stats();
      auto t = Clock::now();
      registry.prepare(next, {next.hash().hex(), spec, "sm_90a"}, cache::OnMiss::compile);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      if (cache_stats().compiles != before.compiles) throw Error("bench: a new layout of a compiled shape compiled");
    }
    std::sort(ms.begin(), ms.end());
    figures.emplace_back(
        fmt::format("new layout of a compiled shape (shared code), {} sm_90a, {} blocks (median of 3), ms",
                    generator::kernel_label(spec), first.blocks()),
        ms[1]);
  }
}

// Cold compiles of the attention kernels for suite A's causal mask (S = 8192, d = 128, bf16) and one
// four times as long (S = 32768: whether compile time grows with the mask): each kernel alone,
// NVRTC only (median of 3). Needs no GPU.
void run_attention_compile(std::vector<std::pair<std::string, double>>& figures) {
  const std::pair<int, int> cases[] = {{8192, 128}, {8192, 64}, {32768, 128}, {32768, 64}};  // S, block
  for (const auto& [seq, block] : cases) {
    const std::vector<Layout> masks{layouts::causal(seq / block)};
    const AttentionOptions o{block, 128, DType::bf16, QkvOrder::bhsd, true, ""};
    auto time = [&](const std::string& source, const std::string& name, const std::string& label,
                    const std::string& arch, const std::string& what) {
      std::vector<double> ms;
      for (int rep = 0; rep < 3; ++rep) {
        auto t = Clock::now();
        runtime::compile(source, name, label, arch, runtime::DriverCache::bypass);
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      }
      std::sort(ms.begin(), ms.end());
      figures.emplace_back(fmt::format("cold compile, attention {} b{} d128 {}, causal S={} (median of 3), ms", what,
                                       block, arch, seq),
                           ms[1]);
    };
    for (const std::string arch : {"sm_90a", "sm_80"}) {
      const auto f = generator::generate_attention_forward(masks, o, arch);
      time(f.source, f.name_expression, f.label, arch, "forward");
      const auto b = generator::generate_attention_backward(masks, o, arch);
      time(b.source, b.main, b.label, arch, "backward main");
    }
    if (seq > 8192) continue;  // the decomposed ops take at most 65535 score tiles
    const auto ops = generator::generate_attention_ops(masks, o);
    time(ops.source, ops.probs_v, ops.label, "sm_80", "decomposed probs_v");
  }
}

// A new attention mask per request (a service that packs each batch differently): an Attention
// built for a mask this process has not met, of a configuration it has compiled (no NVRTC run),
// its forward run once and waited for, against the same forward on an object kept from an earlier
// request. B = 1, H = 16, S = 8192, causal b = 128 d = 128 plus one block above the diagonal that
// differs per mask; memory-only cache (with a directory, each new mask's entry is written there
// too). Every distinct mask's entries and loaded kernels stay bounded (docs/CACHE.md).
void run_mask_per_request(const Env& env, std::vector<std::pair<std::string, double>>& figures) {
  set_cache_directory({});
  const AttentionOptions o{128, 128, DType::bf16, QkvOrder::bhsd, true, ""};
  const std::int64_t heads = 16, seq = 8192, n = heads * seq * 128;
  DeviceBuffer q(n * 2), k(n * 2), v(n * 2), out(n * 2), lse(heads * seq * 4);
  for (const auto* b : {&q, &k, &v}) BSJIT_CU(runtime::driver().cuMemsetD8(b->ptr, 0, b->bytes));
  auto mask = [](int i) {
    std::vector<std::pair<std::int64_t, std::int64_t>> coords;
    for (std::int64_t r = 0; r < 64; ++r)
      for (std::int64_t c = 0; c <= r; ++c) coords.push_back({r, c});
    coords.push_back({i % 63, 63});  // above the diagonal (masked by causal), distinct per i < 63
    return std::vector<Layout>{Layout::from_coords(64, 64, coords)};
  };
  auto request = [&](const Attention& a) {
    a.forward(q.get(), k.get(), v.get(), out.get(), static_cast<float*>(lse.get()), 1, heads, env.stream);
    BSJIT_CU(runtime::driver().cuStreamSynchronize(env.stream));
  };
  auto median = [](std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const Attention kept(mask(62), o);
  request(kept);  // compiles the configuration once
  std::vector<double> fresh, same;
  for (int i = 0; i < 21; ++i) {
    auto t = Clock::now();
    {
      const Attention a(mask(i), o);
      request(a);
    }
    fresh.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    t = Clock::now();
    request(kept);
    same.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  figures.emplace_back("attention, a new mask per request: build the object, forward, wait (S=8192, median of 21), ms",
                       median(fresh));
  figures.emplace_back("attention, the same forward on an object kept from an earlier request, ms", median(same));
}

void run_jit(const Env& env, std::vector<std::pair<std::string, double>>& figures) {
  run_compile(figures);
  std::mt19937_64 rng(12);
  // Disk hit as a fresh process sees it: a new cache object reading, verifying, loading, resolving.
  char tmpl[] = "/tmp/bsjit-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  Layout L = bernoulli_layout(128, 128, 0.1, rng);
  runtime::KernelId id{L.hash().hex(), {Op::forward, 32, DType::bf16, FeatureAxis::last},
                       runtime::default_kernel_arch(runtime::context_arch(runtime::current_context()))};
  auto g = generator::generate_matmul(L, id.spec);
  auto key = cache::make_key(cache::key_inputs(g.source, g.tables, id.arch));
  const cache::Request req = runtime::cache_request(g, key, id.arch, id.layout_hash);
  CacheConfig cfg;
  cfg.directory = dir;
  const runtime::Context ctx = runtime::current_context();
  auto disk_hit = [&](const cache::Request& r) {  // median of 20, ms
    cache::KernelCache(cfg).get(r);
    std::vector<double> hits;
    for (int rep = 0; rep < 20; ++rep) {
      cache::KernelCache fresh(cfg);
      auto t = Clock::now();
      auto k = fresh.get(r, cache::OnMiss::fail);
      auto loaded = runtime::load(*k, ctx);
      hits.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      runtime::unload(loaded, ctx);
    }
    std::sort(hits.begin(), hits.end());
    return hits[10];
  };
  figures.emplace_back("disk hit in a fresh cache: read, verify, load, resolve (median of 20), ms", disk_hit(req));
  // the attention forward at S = 8192, causal, b = 128: 2080 key blocks in pointer tables
  const std::vector<Layout> masks{layouts::causal(64)};
  const auto fa = generator::generate_attention_forward(masks, {128, 128, DType::bf16, QkvOrder::bhsd, true, ""},
                                                        id.arch);
  figures.emplace_back(fmt::format("disk hit in a fresh cache, {} S=8192 (median of 20), ms", fa.label),
                       disk_hit(runtime::named_kernel_request(fa.source, fa.tables, fa.name_expression, fa.label,
                                                              fa.shared_bytes, id.arch, runtime::masks_hash(masks))));
  std::filesystem::remove_all(dir);
  run_mask_per_request(env, figures);

  // Host overhead of one op call (warm) against a bare cuLaunchKernel of the same kernel with the
  // same arguments, prepared once. A one-block layout and n = 1 keep the kernel far shorter than a
  // launch, so both loops measure the host. Block 32 runs the mma.sync kernel; block 64 on sm_90a
  // the TMA kernel, whose op call also encodes its two tensor maps.
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(ctx));
  Layout tiny = Layout::from_coords(1, 1, {{0, 0}});
  DeviceBuffer x(16384), w(16384), y(16384);
  const void *xa = x.get(), *wa = w.get();
  void* ya = y.get();
  const int calls = 20000;
  auto measure = [&](const std::function<void()>& fn) {
    std::vector<double> per_call;
    for (int round = 0; round < 5; ++round) {
      BSJIT_CU(runtime::driver().cuStreamSynchronize(env.stream));
      auto t = Clock::now();
      for (int i = 0; i < calls; ++i) {
        fn();
        if (i % 512 == 511) BSJIT_CU(runtime::driver().cuStreamSynchronize(env.stream));  // keep the queue short
      }
      per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / calls);
    }
    std::sort(per_call.begin(), per_call.end());
    return per_call[2];
  };
  for (int block : {32, 64}) {
    MatMul mm(tiny, {block, DType::bf16, FeatureAxis::last, ""});
    mm.forward(xa, wa, ya, 1, env.stream);
    // n = 1 without OpOptions runs the small-batch variant's plain kernel
    const auto variants = runtime::op_variants(Op::forward, mm.options());
    const auto spec =
        runtime::call_spec(tiny.hash().hex(), variants, static_cast<int>(variants.size()) - 1, true, arch);
    auto p = runtime::KernelRegistry::global().prepare(tiny, {tiny.hash().hex(), spec, arch}, cache::OnMiss::fail);
    const auto loaded = runtime::SharedKernels::global().acquire(p->compiled, ctx);  // the one mm holds
    CUfunction f = loaded->function;
    runtime::KernelArgs args{xa, wa, ya, nullptr, 1, 0, nullptr};
    runtime::launch_prepared(*p, f, ctx, Op::forward, 1, env.stream, args);  // encodes the tensor maps, if any, once
    const auto shape = runtime::launch_shape(*p, Op::forward, 1);
    auto raw_args = runtime::kernel_params(args);
    double bare = measure([&] {
      BSJIT_CU(runtime::driver().cuLaunchKernel(f, shape.grid_x, shape.grid_y, 1, shape.threads, 1, 1,
                                                shape.shared_bytes, env.stream, raw_args.data(), nullptr));
    });
    double op = measure([&] { mm.forward(xa, wa, ya, 1, env.stream); });
    const std::string label = p->generated.label;
    figures.emplace_back(fmt::format("bare cuLaunchKernel per call ({}), us", label), bare);
    figures.emplace_back(fmt::format("MatMul::forward per call, warm ({}), us", label), op);
    figures.emplace_back(fmt::format("host overhead above cuLaunchKernel ({}), us", label), op - bare);
  }
}

// "  WRONG (op, ...)" for a table line's three rows (forward, backward-data, backward-weight) whose
// check exceeded the tolerance (or wrote NaN), else "": a wrong cell is never shown as a speed alone.
std::string wrong_ops(const Row* three, double tolerance) {
  std::string ops;
  for (int j = 0; j < 3; ++j)
    if (!(three[j].error <= tolerance)) ops += (ops.empty() ? "" : ", ") + three[j].op;
  return ops.empty() ? "" : "  WRONG (" + ops + ")";
}

// The layers suite's table: each cell's SOL per op, and its ratio to the SOL of the run's suite-W
// class cell (4096x4096/balanced/8192) of the same block and density, where the run has it: the
// target is 0.8 or more.
void print_layers(const std::vector<Row>& rows) {
  const std::string reference = to_string(default_layer_classes().front());
  std::map<std::tuple<int, double, std::string>, double> ref_sol;
  for (const Row& r : rows)
    if (r.layout == reference) ref_sol[{r.b, r.d, r.op}] = r.sol;
  fmt::print("\n== layers: SOL fraction per op (TFLOP/s), and over suite W's cell ({}) of the same b, d ==\n",
             reference);
  fmt::print("{:28} {:>4} {:>5} | {:>22} | {:>22} | {:>22}\n", "layer (CxK/kind/N)", "b", "d", "forward",
             "backward_data", "backward_weight");
  for (std::size_t i = 0; i + 2 < rows.size(); i += 3) {
    std::string cells;
    for (std::size_t j = i; j < i + 3; ++j) {
      const auto ref = ref_sol.find({rows[j].b, rows[j].d, rows[j].op});
      const std::string vs = ref == ref_sol.end() || rows[j].layout == reference
                                 ? std::string("     ")
                                 : fmt::format("x{:4.2f}", rows[j].sol / ref->second);
      cells += fmt::format(
          " | {:4.2f} ({:5.1f} TF) {}{}", rows[j].sol, rows[j].tflops, vs,
          ref != ref_sol.end() && rows[j].layout != reference && rows[j].sol < 0.8 * ref->second ? "<" : " ");
    }
    fmt::print("{:28} {:>4} {:>5}{}{}\n", rows[i].layout, rows[i].b, rows[i].d, cells, wrong_ops(&rows[i], 1e-2));
  }
}

// A CSV field (RFC 4180): quoted where it holds a comma, a quote or a line break ("causal, 2 kv heads")
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (const char ch : text) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

}  // namespace
}  // namespace bsjit::bench

int main(int argc, char** argv) {
  using namespace bsjit;
  using namespace bsjit::bench;
  CLI::App app{"bsjit-bench: suites W, small and jit of BENCH.md, with cuBLAS, cuSPARSE and copy baselines"};
  std::vector<std::string> suites{"W", "small", "jit"};
  const Grid kSuiteW{{"balanced", "bernoulli"}, {16, 32, 64, 128}, {0.5, 0.25, 0.1, 0.05}};
  // the small batch's table: its balanced layouts drawn first, as when it had no other
  const Grid kSmallBatch{{"balanced", "bernoulli"}, {32, 64}, {0.1}};
  std::vector<int> blocks = kSuiteW.blocks;
  std::vector<double> densities = kSuiteW.densities;
  std::vector<std::string> kinds = kSuiteW.kinds;
  std::string json_path, csv_path;
  int reps = 20;
  app.add_option("-s,--suite", suites,
                 "W, small, jit, A (attention), C (convolution), layers (suite W's cells on other layers), tf32 (fp32 "
                 "inputs, exact and "
                 "TF32), sweep (tile candidates), "
                 "sweep-small (those at N = 64, C = K = 16384), compile (needs no GPU)")
      ->delimiter(',');
  auto* block_option = app.add_option("-b,--block", blocks,
                                      "block sizes of suite W, suite small, suite C and the sweeps (small, "
                                      "sweep-small, C: 32, 64 unless given; C also takes 128)")
                           ->delimiter(',');
  std::int64_t conv_batch = kSuiteCImages;
  app.add_option("--conv-batch", conv_batch, "suite C: the images (BENCH.md's 32 unless given)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  std::string conv_arch;
  app.add_option("--conv-arch", conv_arch,
                 "suite C: build the kernels for this target instead of the GPU's (sm_90 on an H100 or H200: the "
                 "mma.sync kernels instead of the warpgroup ones)");
  auto* density_option =
      app.add_option("-d,--density", densities,
                     "suite W densities; suite C: its balanced masks' (block-diagonal ones always run)")
          ->delimiter(',');
  auto* kinds_option =
      app.add_option("-k,--layouts", kinds,
                     "balanced, bernoulli, skewP (columns of two lengths, the longer 1 + P/100 times the mean: skew20; "
                     "suite small and the sweeps: balanced unless given)")
          ->delimiter(',');
  std::vector<std::string> layer_names;
  app.add_option("--layers", layer_names,
                 "suite layers: the classes CxK/kind/N to run (default: default_layer_classes, e.g. "
                 "4096x4096/balanced/8192,12288x12288/powerlaw/8192); blocks and densities from -b, -d "
                 "(default 32,64,128 and 0.25)")
      ->delimiter(',');
  app.add_option("-r,--reps", reps, "timed repetitions per measurement (median)");
  std::vector<std::string> ops{"forward", "backward_data", "backward_weight"};
  app.add_option("-o,--ops", ops, "the ops the sweeps time")->delimiter(',');
  std::vector<std::string> tiles;
  app.add_option("-t,--tiles", tiles, "the sweeps time only the tile shapes whose tags start with one of these")
      ->delimiter(',');
  bool idle = false;
  app.add_flag("--idle", idle,
               "time each run from an idle GPU with L2 warm, as before 2026-11-30 (default: after a 256 MiB read)");
  app.add_option("--json", json_path, "write results as JSON");
  app.add_option("--csv", csv_path, "write results as CSV");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string why;
    if (!runtime::gpu_available(&why)) {
      if (suites == std::vector<std::string>{"compile"}) {
        std::vector<std::pair<std::string, double>> figures;
        run_compile(figures);
        run_attention_compile(figures);
        for (auto& [k, v] : figures) fmt::print("{:70} {:10.3f}\n", k, v);
        return 0;
      }
      fmt::print(stderr, "bsjit-bench needs a GPU (only --suite compile runs without one): {}\n", why);
      return 2;
    }
    runtime::current_context();
    set_cache_directory({});
    set_flush_before_timing(!idle);
    Env env;
    BSJIT_CU(runtime::driver().cuStreamCreate(&env.stream, CU_STREAM_NON_BLOCKING));
    env.reps = reps;
    env.ops = ops;
  env.tiles = tiles;
    env.copy_bw = copy_bandwidth(env.stream, 10);
    fmt::print("device-to-device copy: {:.2f} TB/s (read + write)\n", env.copy_bw / 1e12);
    // suite small and the sweeps: the kinds given, else balanced (suite W: its own two unless given)
    const std::vector<std::string> kinds_or_balanced =
        kinds_option->count() ? kinds : std::vector<std::string>{"balanced"};
    std::vector<Row> rows, small_rows, tf32_rows, layer_rows;
    std::vector<std::pair<std::string, double>> jit;
    std::vector<AttentionRow> attention_rows;
    std::vector<ConvRow> conv_rows;
    for (const auto& s : suites) {
      if (s == "W")
        run_w(env, 8192, 4096, kSuiteW, {kinds, blocks, densities}, rows, false);
      else if (s == "small")
        run_w(env, 64, 16384, kSmallBatch,
              {kinds_or_balanced, block_option->count() > 0 ? blocks : kSmallBatch.blocks, kSmallBatch.densities},
              small_rows, true);
      else if (s == "jit") run_jit(env, jit);
      else if (s == "layers") {
        std::vector<LayerClass> classes;
        for (const auto& name : layer_names) classes.push_back(parse_layer_class(name));
        if (classes.empty()) classes = default_layer_classes();
        run_layers(env, classes, block_option->count() > 0 ? blocks : std::vector<int>{32, 64, 128},
                   density_option->count() > 0 ? densities : std::vector<double>{0.25}, layer_rows);
      } else if (s == "tf32")
        run_tf32(env, blocks, densities, tf32_rows);
      else if (s == "A") attention_rows = run_suite_a(env.stream, env.reps);
      else if (s == "C")
        conv_rows =
            run_suite_c(env.stream, env.reps, env.copy_bw, block_option->count() > 0 ? blocks : std::vector<int>{},
                        density_option->count() > 0 ? densities : std::vector<double>{}, conv_arch, conv_batch);
      else if (s == "compile") run_compile(jit), run_attention_compile(jit);
      else if (s == "sweep" || s == "sweep-small") {
        nlohmann::json sweep;
        if (s == "sweep")
          run_sweep(env, 8192, 4096, kinds_or_balanced, blocks, densities, sweep);
        else
          run_sweep(env, 64, 16384, kinds_or_balanced, block_option->count() > 0 ? blocks : kSmallBatch.blocks,
                    kSmallBatch.densities, sweep);
        if (!json_path.empty()) std::ofstream(json_path + "." + s + ".json") << sweep.dump(1) << "\n";
      }
      else throw Error("unknown suite " + s);
    }
    // Summary last: the table the results file takes.
    if (!rows.empty()) {
      fmt::print("\n== suite W (N=8192, C=K=4096, bf16): TFLOP/s on nonzero blocks, SOL fraction ==\n");
      fmt::print("{:9} {:>4} {:>5} | {:>16} | {:>16} | {:>16} | {:>8}\n", "layout", "b", "d", "forward", "backward_data",
                 "backward_weight", "fwd/cuSP");
      for (std::size_t i = 0; i + 2 < rows.size(); i += 3)
        fmt::print("{:9} {:>4} {:>5} | {:6.1f} TF {:4.2f} | {:6.1f} TF {:4.2f} | {:6.1f} TF {:4.2f} | {:8.2f}{}\n",
                   rows[i].layout, rows[i].b, rows[i].d, rows[i].tflops, rows[i].sol, rows[i + 1].tflops,
                   rows[i + 1].sol, rows[i + 2].tflops, rows[i + 2].sol, rows[i].vs_cusparse,
                   wrong_ops(&rows[i], 1e-2));
      // the dense equivalent's own SOL fraction (floor over its time: sol / vs_dense_eq) beside ours
      fmt::print("\n== suite W: cuBLAS on the dense equivalent (same FLOPs, outputs, reduction length): its SOL "
                 "fraction, and ours over it ==\n");
      fmt::print("{:9} {:>4} {:>5} | {:>11} | {:>11} | {:>11}\n", "layout", "b", "d", "forward", "backward_data",
                 "backward_w");
      for (std::size_t i = 0; i + 2 < rows.size(); i += 3)
        fmt::print("{:9} {:>4} {:>5} | {:4.2f} x{:4.2f} | {:4.2f} x{:4.2f} | {:4.2f} x{:4.2f}\n", rows[i].layout,
                   rows[i].b, rows[i].d, rows[i].sol / rows[i].vs_dense_eq, rows[i].vs_dense_eq,
                   rows[i + 1].sol / rows[i + 1].vs_dense_eq, rows[i + 1].vs_dense_eq,
                   rows[i + 2].sol / rows[i + 2].vs_dense_eq, rows[i + 2].vs_dense_eq);
    }
    if (!layer_rows.empty()) print_layers(layer_rows);
    if (!small_rows.empty()) {
      fmt::print("\n== small batch (N=64, C=K=16384, d=0.1): fraction of copy bandwidth on W; the dense "
                 "equivalent's, and ours over it ==\n");
      for (const auto& r : small_rows)
        fmt::print("{:9} b{:<3} {:15} {:8.4f} ms  {:4.2f}   dense-eq {:4.2f}  x{:4.2f}{}\n", r.layout, r.b, r.op, r.ms,
                   r.sol, r.sol / r.vs_dense_eq, r.vs_dense_eq, r.error <= 1e-2 ? "" : "  WRONG");
    }
    if (!tf32_rows.empty()) {
      fmt::print("\n== fp32 inputs (N=8192, C=K=4096, balanced): TFLOP/s, fraction of the matching cuBLAS rate ==\n");
      fmt::print("{:5} {:>4} {:>5} | {:>17} | {:>17} | {:>17}\n", "mode", "b", "d", "forward", "backward_data",
                 "backward_weight");
      for (std::size_t i = 0; i + 2 < tf32_rows.size(); i += 3) {
        const Row* r = &tf32_rows[i];
        fmt::print("{:5} {:>4} {:>5} | {:6.1f} TF x{:4.2f} | {:6.1f} TF x{:4.2f} | {:6.1f} TF x{:4.2f}{}\n",
                   r[0].layout, r[0].b, r[0].d, r[0].tflops, r[0].vs_cublas, r[1].tflops, r[1].vs_cublas, r[2].tflops,
                   r[2].vs_cublas, wrong_ops(r, r[0].layout == "tf32" ? 1e-2 : 1e-5));
      }
    }
    if (!attention_rows.empty()) {
      fmt::print("\n== suite A (B=4, H=16, S=8192, bf16, causal inside the diagonal): fused forward, backward ==\n");
      for (const auto& r : attention_rows)
        fmt::print(
            "{:22} b{:<3} d{:<3} {:8.3f} ms {:7.1f} TF/s   backward {:8.3f} ms   decomposed forward {:8.3f} ms{}\n",
            r.mask, r.block, r.head_dim, r.ms, r.tflops, r.backward_ms, r.decomposed_ms,
            r.error <= 1e-2 && r.backward_error <= 1e-2 ? "" : "  WRONG");
    }
    if (!jit.empty()) {
      fmt::print("\n== JIT figures ==\n");
      for (auto& [k, v] : jit) fmt::print("{:70} {:10.3f}\n", k, v);
    }
    nlohmann::json j;
    const auto set_name = [&](const std::vector<Row>* set) {
      return set == &rows ? "suite_w" : set == &small_rows ? "small" : set == &layer_rows ? "layers" : "tf32";
    };
    for (auto* set : {&rows, &small_rows, &tf32_rows, &layer_rows})
      for (const auto& r : *set)
        j[set_name(set)].push_back({{"layout", r.layout},
                                    {"block", r.b},
                                    {"density", r.d},
                                    {"op", r.op},
                                    {"ms", r.ms},
                                    {"tflops", r.tflops},
                                    {"sol", r.sol},
                                    {"vs_cublas", r.vs_cublas},
                                    {"vs_cusparse", std::isnan(r.vs_cusparse) ? 0.0 : r.vs_cusparse},
                                    {"vs_dense_equivalent", std::isnan(r.vs_dense_eq) ? 0.0 : r.vs_dense_eq},
                                    {"error", r.error},
                                    {"floor_ms", r.floor_ms}});
    for (const auto& r : attention_rows)
      j["suite_a"].push_back({{"mask", r.mask},
                              {"block", r.block},
                              {"head_dim", r.head_dim},
                              {"ms", r.ms},
                              {"tflops", r.tflops},
                              {"error", r.error},
                              {"backward_ms", r.backward_ms},
                              {"backward_error", r.backward_error},
                              {"decomposed_forward_ms", r.decomposed_ms}});
    for (const auto& r : conv_rows)
      j["suite_c"].push_back({{"shape", r.shape},
                              {"mask", r.mask},
                              {"block", r.b},
                              {"density", r.d},
                              {"op", r.op},
                              {"ms", r.ms},
                              {"tflops", r.tflops},
                              {"sol", r.sol},
                              {"floor_ms", r.floor_ms},
                              {"cudnn_dense_ms", r.dense_ms},
                              {"cudnn_grouped_ms", r.grouped_ms},
                              {"error", r.error}});
    for (auto& [k, v] : jit) j["jit"][k] = v;
    j["copy_tbps"] = env.copy_bw / 1e12;
    if (!json_path.empty()) std::ofstream(json_path) << j.dump(1) << "\n";
    if (!csv_path.empty()) {
      std::ofstream csv(csv_path);
      csv << "suite,layout,block,density,op,ms,tflops,sol,vs_cublas,vs_cusparse,error,vs_dense_equivalent\n";
      for (auto* set : {&rows, &small_rows, &tf32_rows, &layer_rows})
        for (const auto& r : *set)
          csv << fmt::format("{},{},{},{},{},{:.5f},{:.2f},{:.3f},{:.3f},{:.3f},{:.2e},{:.3f}\n",
                             set == &rows ? "W" : set_name(set), csv_field(r.layout), r.b, r.d, r.op, r.ms, r.tflops,
                             r.sol, r.vs_cublas, r.vs_cusparse, r.error, r.vs_dense_eq);
      // suite A: the head dim in the density column; TFLOP/s of the attended pairs (4 · D FLOPs
      // each forward, 10 · D backward), so that compare.py (and ab.sh) compare these cells too
      for (const auto& r : attention_rows) {
        const double forward_flop_ms = r.tflops * r.ms;  // TFLOP/s · ms of the forward
        const std::pair<const char*, double> ops[] = {{"attention_fwd", r.ms},
                                                      {"attention_bwd", r.backward_ms},
                                                      {"attention_decomposed", r.decomposed_ms}};
        for (const auto& [op, ms] : ops)
          csv << fmt::format("A,{},{},{},{},{:.5f},{:.2f},0,0,0,{:.2e},0\n", csv_field(r.mask), r.block, r.head_dim, op,
                             ms, forward_flop_ms * (op == ops[1].first ? 2.5 : 1.0) / ms,
                             op == ops[1].first ? r.backward_error : r.error);
      }
      // suite C: the layer and mask in the layout column, the mask's density
      for (const auto& r : conv_rows)
        csv << fmt::format("C,{},{},{},{},{:.5f},{:.2f},{:.3f},0,0,{:.2e},0\n", csv_field(r.shape + " " + r.mask), r.b,
                           r.d, r.op, r.ms, r.tflops, r.sol, r.error);
    }
    bool wrong = false;
    for (auto* set : {&rows, &small_rows, &layer_rows})
      for (const auto& r : *set) wrong |= !(r.error <= 1e-2);
    for (const auto& r : tf32_rows) wrong |= !(r.error <= (r.layout == "tf32" ? 1e-2 : 1e-5));
    for (const auto& r : attention_rows) wrong |= !(r.error <= 1e-2) || !(r.backward_error <= 1e-2);
    for (const auto& r : conv_rows) wrong |= !(r.error <= 1e-2);
    return wrong ? 1 : 0;
  } catch (const Error& e) {
    fmt::print(stderr, "bsjit-bench: {}\n", e.what());
    return 1;
  }
}
