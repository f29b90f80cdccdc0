#include "bsjit/types.hpp"

#include <fmt/format.h>

#include "bsjit/error.hpp"

namespace bsjit {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

std::string_view to_string(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward_data: return "backward_data";
    case Op::backward_weight: return "backward_weight";
  }
  return "?";
}

std::string_view to_string(FeatureAxis axis) { return axis == FeatureAxis::last ? "last" : "first"; }
std::string_view to_string(QkvOrder order) { return order == QkvOrder::bshd ? "bshd" : "bhsd"; }
std::string_view to_string(Calls calls) {
  return calls == Calls::all ? "all" : calls == Calls::plain ? "plain" : "with_options";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") return DType::f32;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  throw Error(fmt::format("unknown dtype '{}'; expected f32, f16 or bf16", s));
}

Op parse_op(std::string_view s) {
  if (s == "forward" || s == "fwd") return Op::forward;
  if (s == "backward_data" || s == "bwd_data" || s == "dx") return Op::backward_data;
  if (s == "backward_weight" || s == "bwd_weight" || s == "dw") return Op::backward_weight;
  throw Error(fmt::format("unknown op '{}'; expected forward, backward_data or backward_weight", s));
}

FeatureAxis parse_feature_axis(std::string_view s) {
  if (s == "last" || s == "nc") return FeatureAxis::last;
  if (s == "first" || s == "cn") return FeatureAxis::first;
  throw Error(fmt::format("unknown feature axis '{}'; expected last ([N, C]) or first ([C, N])", s));
}

QkvOrder parse_qkv_order(std::string_view s) {
  if (s == "bshd") return QkvOrder::bshd;
  if (s == "bhsd") return QkvOrder::bhsd;
  throw Error(fmt::format("unknown tensor order '{}'; expected bshd or bhsd", s));
}

std::string_view to_string(ActivationOrder order) { return order == ActivationOrder::ndhwc ? "ndhwc" : "ncdhw"; }

ActivationOrder parse_activation_order(std::string_view s) {
  if (s == "ndhwc" || s == "channels_last") return ActivationOrder::ndhwc;
  if (s == "ncdhw" || s == "channels_first") return ActivationOrder::ncdhw;
  throw Error(
      fmt::format("unknown activation order '{}'; expected ndhwc (channels_last) or ncdhw (channels_first)", s));
}

Calls parse_calls(std::string_view s) {
  if (s == "all") return Calls::all;
  if (s == "plain") return Calls::plain;
  if (s == "with_options") return Calls::with_options;
  throw Error(fmt::format("unknown calls '{}'; expected all, plain (no OpOptions) or with_options", s));
}

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

}  // namespace bsjit
