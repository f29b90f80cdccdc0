// bsjit._C: the C++ library as the Python package calls it. It takes device pointers, sizes and
// stream handles as integers and knows nothing of torch: the PyTorch ops (python/bsjit/_ops.py)
// are registered with torch.library in Python, so one build of this module serves every torch
// version (torch's stable C ABI would tie it to torch ≥ 2.9's headers at build time and still
// leave the fake kernels and autograd to be written in Python). Every bsjit::Error becomes a
// bsjit.Error (a RuntimeError) with the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/bsjit.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

bsjit::Stream stream_of(std::uintptr_t handle) { return reinterpret_cast<bsjit::Stream>(handle); }
template <class T>
T* pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// The layout of a mask given as its bytes (row-major, rows × cols, nonzero: a block).
bsjit::Layout layout_from_mask(std::int64_t rows, std::int64_t cols, nb::bytes mask) {
  const auto* data = static_cast<const std::uint8_t*>(mask.data());
  if (rows < 0 || cols < 0 || static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) != mask.size())
    throw bsjit::Error("bsjit: a mask of " + std::to_string(rows) + " × " + std::to_string(cols) + " blocks needs " +
                       std::to_string(rows * cols) + " bytes, not " + std::to_string(mask.size()));
  return bsjit::Layout::from_dense(rows, cols, std::vector<std::uint8_t>(data, data + mask.size()));
}

void run(const bsjit::MatMul& mm, const std::string& op, std::uintptr_t a, std::uintptr_t b, std::uintptr_t out,
         std::int64_t n, std::uintptr_t stream, bool accumulate, std::uintptr_t gate, std::uintptr_t workspace,
         std::size_t workspace_bytes) {
  const bsjit::OpOptions options{accumulate, pointer<const float>(gate), pointer<void>(workspace), workspace_bytes};
  switch (bsjit::parse_op(op)) {
    case bsjit::Op::forward:
      return mm.forward(pointer<const void>(a), pointer<const void>(b), pointer<void>(out), n, stream_of(stream),
                        options);
    case bsjit::Op::backward_data:
      return mm.backward_data(pointer<const void>(a), pointer<const void>(b), pointer<void>(out), n,
                              stream_of(stream), options);
    case bsjit::Op::backward_weight:
      return mm.backward_weight(pointer<const void>(a), pointer<const void>(b), pointer<void>(out), n,
                                stream_of(stream), options);
  }
}

// AttentionOptions by field, as the Python side passes them.
bsjit::AttentionOptions attention_options(int block, int head_dim, const std::string& dtype, const std::string& order,
                                          bool causal, const std::string& arch, int kv_group) {
  bsjit::AttentionOptions o;
  o.block = block;
  o.head_dim = head_dim;
  o.dtype = bsjit::parse_dtype(dtype);
  o.order = bsjit::parse_qkv_order(order);
  o.causal = causal;
  o.arch = arch;
  o.kv_group = kv_group;
  return o;
}

void construct_attention(bsjit::Attention* self, const std::vector<bsjit::Layout>& masks, int block, int head_dim,
                         const std::string& dtype, const std::string& order, bool causal, const std::string& arch,
                         int kv_group) {
  new (self) bsjit::Attention(masks, attention_options(block, head_dim, dtype, order, causal, arch, kv_group));
}

// element_bits: ElementMasks::bits as little-endian bytes (empty: no element masks).
void construct_attention_ops(bsjit::AttentionOps* self, const std::vector<bsjit::Layout>& masks, int block,
                             int head_dim, const std::string& dtype, const std::string& order, bool causal,
                             const std::string& arch, nb::bytes element_bits, int kv_group) {
  if (element_bits.size() % sizeof(std::uint32_t))
    throw bsjit::Error("bsjit: element mask bits must be whole 32-bit words, got " +
                       std::to_string(element_bits.size()) + " bytes");
  bsjit::ElementMasks em;
  em.bits.resize(element_bits.size() / sizeof(std::uint32_t));
  std::memcpy(em.bits.data(), element_bits.data(), element_bits.size());
  new (self) bsjit::AttentionOps(masks, attention_options(block, head_dim, dtype, order, causal, arch, kv_group),
                                 std::move(em));
}

// A ConvGeometry from 18 ints: in, filter, stride, dilation, padding before, padding after (D, H, W
// each).
bsjit::ConvOp conv_op(const std::string& op) {
  if (op == "fprop") return bsjit::ConvOp::fprop;
  if (op == "bprop") return bsjit::ConvOp::bprop;
  if (op == "updat") return bsjit::ConvOp::updat;
  throw bsjit::Error("bsjit: no conv op '" + op + "'");
}

bsjit::ConvGeometry conv_geometry(const std::vector<std::int64_t>& g) {
  if (g.size() != 18) throw bsjit::Error("bsjit: a conv geometry is 18 ints, got " + std::to_string(g.size()));
  bsjit::ConvGeometry geo;
  for (int i = 0; i < 3; ++i) {
    geo.in[i] = g[i], geo.filter[i] = g[3 + i], geo.stride[i] = g[6 + i], geo.dilation[i] = g[9 + i];
    geo.pad_before[i] = g[12 + i], geo.pad_after[i] = g[15 + i];
  }
  geo.check();
  return geo;
}

std::vector<bsjit::Op> ops_of(const std::vector<std::string>& names) {
  std::vector<bsjit::Op> ops;
  for (const auto& n : names) ops.push_back(bsjit::parse_op(n));
  return ops;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "bsjit's C++ library, called by the bsjit package (device pointers and streams as integers)";
  nb::exception<bsjit::Error>(m, "Error", PyExc_RuntimeError);
  // The package's layout registry holds Layouts for the life of the interpreter on purpose (handles
  // stay valid): those still alive at exit are not leaks to report.
  nb::set_leak_warnings(false);

  nb::class_<bsjit::Layout>(m, "Layout")
      .def_static("from_mask", &layout_from_mask, "rows"_a, "cols"_a, "mask"_a)
      .def_static("from_coords", &bsjit::Layout::from_coords, "rows"_a, "cols"_a, "coords"_a)
      .def_static("load", &bsjit::Layout::load, "path"_a)
      .def_prop_ro("rows", &bsjit::Layout::rows)
      .def_prop_ro("cols", &bsjit::Layout::cols)
      .def_prop_ro("blocks", &bsjit::Layout::blocks)
      .def("hash", [](const bsjit::Layout& l) { return l.hash().hex(); })
      .def("dense", [](const bsjit::Layout& l) {
        const auto d = l.dense();
        return nb::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      })
      .def("coords", [](const bsjit::Layout& l) {
        std::vector<std::pair<std::int64_t, std::int64_t>> c(l.coords().begin(), l.coords().end());
        return c;
      })
      .def("transposed", &bsjit::Layout::transposed)
      .def("save", [](const bsjit::Layout& l, const std::filesystem::path& p) {
        if (p.extension() == ".npy") l.save_npy(p);
        else l.save_json(p);
      })
      .def("stats", [](const bsjit::Layout& l) {
        const auto s = l.stats();
        nb::dict d;
        d["rows"] = s.rows, d["cols"] = s.cols, d["blocks"] = s.blocks, d["density"] = s.density;
        d["min_blocks_per_row"] = s.min_blocks_per_row, d["max_blocks_per_row"] = s.max_blocks_per_row;
        d["min_blocks_per_col"] = s.min_blocks_per_col, d["max_blocks_per_col"] = s.max_blocks_per_col;
        d["empty_rows"] = s.empty_rows, d["empty_cols"] = s.empty_cols;
        d["mean_blocks_per_row"] = s.mean_blocks_per_row, d["mean_blocks_per_col"] = s.mean_blocks_per_col;
        return d;
      })
      .def("__eq__", [](const bsjit::Layout& a, const bsjit::Layout& b) { return a == b; });

  nb::class_<bsjit::MatMul>(m, "MatMul")
      .def(
          "__init__",
          [](bsjit::MatMul* self, const bsjit::Layout& layout, int block, const std::string& dtype,
             const std::string& feature_axis, bool tf32, const std::string& arch, int sms) {
            bsjit::MatMulOptions o;
            o.block = block;
            o.dtype = bsjit::parse_dtype(dtype);
            o.feature_axis = bsjit::parse_feature_axis(feature_axis);
            o.tf32 = tf32;
            o.arch = arch;
            o.sms = sms;
            new (self) bsjit::MatMul(layout, o);
          },
          "layout"_a, "block"_a, "dtype"_a, "feature_axis"_a = "last", "tf32"_a = false, "arch"_a = "", "sms"_a = 0)
      .def("run", &run, "op"_a, "a"_a, "b"_a, "out"_a, "n"_a, "stream"_a, "accumulate"_a = false, "gate"_a = 0,
           "workspace"_a = 0, "workspace_bytes"_a = 0, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "workspace_size",
          [](const bsjit::MatMul& mm, const std::string& op, std::int64_t n, bool gated) {
            bsjit::OpOptions call;
            call.accumulate = gated;  // a call with options: the general kernel, as a gated call runs
            return mm.workspace_size(bsjit::parse_op(op), n, call);
          },
          "op"_a, "n"_a, "gated"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def_static("workspace_counter_bytes", &bsjit::MatMul::workspace_counter_bytes)
      .def(
          "precompile",
          [](const bsjit::MatMul& mm, const std::vector<std::string>& ops, const std::string& arch,
             const std::string& calls) { return mm.precompile(ops_of(ops), arch, bsjit::parse_calls(calls)); },
          "ops"_a, "arch"_a, "calls"_a = "all", nb::call_guard<nb::gil_scoped_release>())
      .def(
          "prepare",
          [](const bsjit::MatMul& mm, const std::vector<std::string>& ops, const std::string& calls) {
            mm.prepare(ops_of(ops), bsjit::parse_calls(calls));
          },
          "ops"_a, "calls"_a = "all", nb::call_guard<nb::gil_scoped_release>())
      .def(
          "kernel_label",
          [](const bsjit::MatMul& mm, const std::string& op, std::int64_t n, bool with_options) {
            bsjit::OpOptions o;
            o.accumulate = with_options;
            return mm.kernel_label(bsjit::parse_op(op), n, o);
          },
          "op"_a, "n"_a, "with_options"_a = false)
      // times every tile shape op can run with at n rows on the current GPU, keeps the fastest (for this
      // layout, block, dtype and feature axis at n's batch class, in the cache too): (kept, [(shape, ms)])
      .def(
          "autotune",
          [](const bsjit::MatMul& mm, const std::string& op, std::int64_t n, std::uintptr_t stream) {
            const bsjit::TuneResult r = mm.autotune(bsjit::parse_op(op), n, stream_of(stream));
            return std::make_pair(r.chosen, r.milliseconds);
          },
          "op"_a, "n"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("in_features", &bsjit::MatMul::in_features)
      .def_prop_ro("out_features", &bsjit::MatMul::out_features);

  nb::class_<bsjit::Attention>(m, "Attention")
      .def("__init__", &construct_attention, "masks"_a, "block"_a, "head_dim"_a, "dtype"_a, "order"_a = "bshd",
           "causal"_a = false, "arch"_a = "", "kv_group"_a = 1)
      .def(
          "forward",
          [](const bsjit::Attention& a, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t out,
             std::uintptr_t lse, std::int64_t batch, std::int64_t heads, std::uintptr_t stream, float scale,
             std::uintptr_t key_padding) {
            a.forward(pointer<const void>(q), pointer<const void>(k), pointer<const void>(v), pointer<void>(out),
                      pointer<float>(lse), batch, heads, stream_of(stream), scale,
                      pointer<const std::uint8_t>(key_padding));
          },
          "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "batch"_a, "heads"_a, "stream"_a, "scale"_a = 0.0f,
          "key_padding"_a = 0, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "backward",
          [](const bsjit::Attention& a, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t out,
             std::uintptr_t lse, std::uintptr_t dout, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv,
             std::int64_t batch, std::int64_t heads, std::uintptr_t stream, float scale, std::uintptr_t key_padding,
             std::uintptr_t workspace, std::size_t workspace_bytes) {
            a.backward(pointer<const void>(q), pointer<const void>(k), pointer<const void>(v), pointer<const void>(out),
                       pointer<const float>(lse), pointer<const void>(dout), pointer<void>(dq), pointer<void>(dk),
                       pointer<void>(dv), batch, heads, stream_of(stream), scale,
                       pointer<const std::uint8_t>(key_padding), pointer<void>(workspace), workspace_bytes);
          },
          "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a, "batch"_a, "heads"_a, "stream"_a,
          "scale"_a = 0.0f, "key_padding"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0,
          nb::call_guard<nb::gil_scoped_release>())
      .def("backward_workspace_size", &bsjit::Attention::backward_workspace_size, "batch"_a, "heads"_a)
      .def("precompile", &bsjit::Attention::precompile, "arch"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("load", &bsjit::Attention::load, "strict"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("seq_q", &bsjit::Attention::seq_q)
      .def_prop_ro("seq_k", &bsjit::Attention::seq_k);

  // The decomposed ops: block-sparse tensors [batch, sparse_elements(heads)] as pointers.
  nb::class_<bsjit::AttentionOps>(m, "AttentionOps")
      .def("__init__", &construct_attention_ops, "masks"_a, "block"_a, "head_dim"_a, "dtype"_a, "order"_a = "bshd",
           "causal"_a = false, "arch"_a = "", "element_bits"_a = nb::bytes("", 0), "kv_group"_a = 1)
      .def(
          "run",
          [](const bsjit::AttentionOps& a, const std::string& op, std::uintptr_t x, std::uintptr_t y,
             std::uintptr_t out, std::int64_t batch, std::int64_t heads, std::uintptr_t stream, float scale,
             std::uintptr_t key_padding) {
            const auto X = pointer<const void>(x), Y = pointer<const void>(y);
            void* O = pointer<void>(out);
            const auto s = stream_of(stream);
            if (op == "scores")
              a.scores(X, Y, O, batch, heads, s);
            else if (op == "softmax")
              a.softmax(X, O, batch, heads, s, scale, pointer<const std::uint8_t>(key_padding));
            else if (op == "softmax_grad")
              a.softmax_grad(X, Y, O, batch, heads, s, scale);
            else if (op == "probs_v")
              a.probs_v(X, Y, O, batch, heads, s);
            else if (op == "probs_t")
              a.probs_t(X, Y, O, batch, heads, s);
            else
              throw bsjit::Error("bsjit: no attention op '" + op + "'");
          },
          "op"_a, "x"_a, "y"_a, "out"_a, "batch"_a, "heads"_a, "stream"_a, "scale"_a = 0.0f, "key_padding"_a = 0,
          nb::call_guard<nb::gil_scoped_release>())
      .def("sparse_elements", &bsjit::AttentionOps::sparse_elements, "heads"_a)
      .def("precompile", &bsjit::AttentionOps::precompile, "arch"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("load", &bsjit::AttentionOps::load, "strict"_a = false, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<bsjit::ConvLayout>(m, "ConvLayout")
      .def_static(
          "from_blocks",
          [](std::int64_t C, std::int64_t K,
             const std::vector<std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>>& blocks) {
            std::vector<bsjit::ConvBlock> b;
            for (const auto& [c, k] : blocks) b.push_back({c, k});
            return bsjit::ConvLayout::from_blocks(C, K, std::move(b));
          },
          "C"_a, "K"_a, "blocks"_a)
      .def_static("from_mask", &bsjit::ConvLayout::from_mask, "mask"_a, "block"_a)
      .def_static("load", &bsjit::ConvLayout::load, "path"_a, "block"_a = 0)
      .def_prop_ro("C", &bsjit::ConvLayout::C)
      .def_prop_ro("K", &bsjit::ConvLayout::K)
      .def("blocks",
           [](const bsjit::ConvLayout& l) {
             std::vector<std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>> out;
             for (const auto& b : l.blocks()) out.push_back({b.c, b.k});
             return out;
           })
      .def("filter_elements", &bsjit::ConvLayout::filter_elements, "taps"_a)
      .def("filter_offset", &bsjit::ConvLayout::filter_offset, "block"_a, "taps"_a);

  // geometry: 18 ints (conv_geometry); ops "fprop", "bprop", "updat" as bsjit::Conv's.
  nb::class_<bsjit::Conv>(m, "Conv")
      .def(
          "__init__",
          [](bsjit::Conv* self, const bsjit::ConvLayout& layout, const std::vector<std::int64_t>& geometry,
             const std::string& dtype, bool channels_last, bool deconv, const std::string& arch) {
            bsjit::ConvOptions o;
            o.dtype = bsjit::parse_dtype(dtype);
            o.order = channels_last ? bsjit::ActivationOrder::ndhwc : bsjit::ActivationOrder::ncdhw;
            o.deconv = deconv;
            o.arch = arch;
            new (self) bsjit::Conv(layout, conv_geometry(geometry), o);
          },
          "layout"_a, "geometry"_a, "dtype"_a, "channels_last"_a = true, "deconv"_a = false, "arch"_a = "")
      .def(
          "run",
          [](const bsjit::Conv& c, const std::string& op, std::uintptr_t a, std::uintptr_t b, std::uintptr_t out,
             std::int64_t n, std::uintptr_t stream, bool accumulate, std::uintptr_t gate, std::uintptr_t workspace,
             std::size_t workspace_bytes) {
            bsjit::OpOptions o;
            o.accumulate = accumulate;
            o.gate = pointer<const float>(gate);
            o.workspace = pointer<void>(workspace), o.workspace_bytes = workspace_bytes;
            const auto A = pointer<const void>(a), B = pointer<const void>(b);
            if (op == "fprop")
              c.fprop(A, B, pointer<void>(out), n, stream_of(stream), o);
            else if (op == "bprop")
              c.bprop(A, B, pointer<void>(out), n, stream_of(stream), o);
            else if (op == "updat")
              c.updat(A, B, pointer<void>(out), n, stream_of(stream), o);
            else
              throw bsjit::Error("bsjit: no conv op '" + op + "'");
          },
          "op"_a, "a"_a, "b"_a, "out"_a, "n"_a, "stream"_a, "accumulate"_a = false, "gate"_a = 0, "workspace"_a = 0,
          "workspace_bytes"_a = 0, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "workspace_size",
          [](const bsjit::Conv& c, const std::string& op, std::int64_t n, bool gated) {
            bsjit::OpOptions call;
            call.accumulate = gated;  // a call with options: the general kernel, as a gated call runs
            if (op != "fprop" && op != "bprop" && op != "updat") throw bsjit::Error("bsjit: no conv op '" + op + "'");
            return c.workspace_size(op == "fprop"   ? bsjit::ConvOp::fprop
                                    : op == "bprop" ? bsjit::ConvOp::bprop
                                                    : bsjit::ConvOp::updat,
                                    n, call);
          },
          "op"_a, "n"_a, "gated"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "l2_normalize",
          [](const bsjit::Conv& c, std::uintptr_t f, std::uintptr_t gain, std::uintptr_t out, std::uintptr_t sums,
             float epsilon, std::uintptr_t stream) {
            c.l2_normalize(pointer<const void>(f), pointer<const float>(gain), pointer<void>(out), pointer<float>(sums),
                           epsilon, stream_of(stream));
          },
          "f"_a, "gain"_a, "out"_a, "sum_squares"_a, "epsilon"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "l2_normalize_backward",
          [](const bsjit::Conv& c, std::uintptr_t grad_out, std::uintptr_t f, std::uintptr_t gain, std::uintptr_t sums,
             std::uintptr_t grad_f, std::uintptr_t grad_gain, float epsilon, std::uintptr_t stream) {
            c.l2_normalize_backward(pointer<const void>(grad_out), pointer<const void>(f), pointer<const float>(gain),
                                    pointer<const float>(sums), pointer<void>(grad_f), pointer<float>(grad_gain),
                                    epsilon, stream_of(stream));
          },
          "grad_out"_a, "f"_a, "gain"_a, "sum_squares"_a, "grad_f"_a, "grad_gain"_a, "epsilon"_a, "stream"_a,
          nb::call_guard<nb::gil_scoped_release>())
      .def("normalized_rows", &bsjit::Conv::normalized_rows)
      // the kernels an op can run with, the one it runs, a pinned one, and autotune's choice: (the
      // kernel kept, [(kernel, ms)])
      .def(
          "kernel_names", [](const bsjit::Conv& c, const std::string& op) { return c.kernel_names(conv_op(op)); },
          "op"_a)
      .def(
          "kernel_name", [](const bsjit::Conv& c, const std::string& op) { return c.kernel_name(conv_op(op)); }, "op"_a)
      .def(
          "use_kernel",
          [](const bsjit::Conv& c, const std::string& op, const std::string& name) { c.use_kernel(conv_op(op), name); },
          "op"_a, "name"_a)
      .def(
          "autotune",
          [](const bsjit::Conv& c, const std::string& op, std::int64_t n, std::uintptr_t stream) {
            const bsjit::TuneResult r = c.autotune(conv_op(op), n, stream_of(stream));
            return std::make_pair(r.chosen, r.milliseconds);
          },
          "op"_a, "n"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("precompile", &bsjit::Conv::precompile, "arch"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("load", &bsjit::Conv::load, "strict"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def("input_elements", &bsjit::Conv::input_elements, "n"_a)
      .def("output_elements", &bsjit::Conv::output_elements, "n"_a)
      .def("filter_elements", &bsjit::Conv::filter_elements);

  nb::class_<bsjit::ConvEdgeBias>(m, "ConvEdgeBias")
      .def(
          "__init__",
          [](bsjit::ConvEdgeBias* self, const std::vector<std::int64_t>& geometry, std::int64_t channels,
             const std::string& dtype, bool channels_last, bool deconv) {
            bsjit::ConvOptions o;
            o.dtype = bsjit::parse_dtype(dtype);
            o.order = channels_last ? bsjit::ActivationOrder::ndhwc : bsjit::ActivationOrder::ncdhw;
            o.deconv = deconv;
            new (self) bsjit::ConvEdgeBias(conv_geometry(geometry), channels, o);
          },
          "geometry"_a, "channels"_a, "dtype"_a, "channels_last"_a = true, "deconv"_a = false)
      .def(
          "forward",
          [](const bsjit::ConvEdgeBias& e, std::uintptr_t x, std::uintptr_t gain, std::uintptr_t bias, std::uintptr_t y,
             std::int64_t n, std::uintptr_t stream) {
            e.forward(pointer<const void>(x), pointer<const float>(gain), pointer<const float>(bias), pointer<void>(y),
                      n, stream_of(stream));
          },
          "x"_a, "gain"_a, "bias"_a, "y"_a, "n"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "backward",
          [](const bsjit::ConvEdgeBias& e, std::uintptr_t dy, std::uintptr_t x, std::uintptr_t gain, std::uintptr_t dx,
             std::uintptr_t grad_gain, std::uintptr_t grad_bias, std::int64_t n, std::uintptr_t stream) {
            e.backward(pointer<const void>(dy), pointer<const void>(x), pointer<const float>(gain), pointer<void>(dx),
                       pointer<float>(grad_gain), pointer<float>(grad_bias), n, stream_of(stream));
          },
          "dy"_a, "x"_a, "gain"_a, "dx"_a, "grad_gain"_a, "grad_bias"_a, "n"_a, "stream"_a,
          nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("edges", &bsjit::ConvEdgeBias::edges)
      .def_prop_ro("positions", &bsjit::ConvEdgeBias::positions)
      .def("position_edges", &bsjit::ConvEdgeBias::position_edges);

  m.def("set_cache_directory", &bsjit::set_cache_directory, "directory"_a);
  m.def("cache_directory", &bsjit::cache_directory);
  m.def("set_strict_cache", &bsjit::set_strict_cache, "strict"_a);
  m.def("cache_stats", [] {
    const auto s = bsjit::cache_stats();
    nb::dict d;
    d["memory_hits"] = s.memory_hits, d["disk_hits"] = s.disk_hits, d["compiles"] = s.compiles;
    d["shared_compiles"] = s.shared_compiles, d["bad_entries"] = s.bad_entries;
    return d;
  });
}
