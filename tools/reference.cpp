#include "reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/parallel.hpp"

namespace bsjit::reference {
namespace {

std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t float_to_f16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7fffffff;
  if (x >= 0x7f800000) return static_cast<std::uint16_t>(sign | (x > 0x7f800000 ? 0x7e00 : 0x7c00));
  if (x >= 0x477ff000) return static_cast<std::uint16_t>(sign | 0x7c00);  // overflow → inf
  if (x < 0x38800000) {                                                   // subnormal or zero
    float a = std::bit_cast<float>(x);
    // a / 2^-24 rounded to nearest even
    float q = std::nearbyint(a * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(q));
  }
  std::uint32_t mant = x & 0x7fffff;
  std::uint32_t exp = (x >> 23) - 127 + 15;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  std::uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // carries into the exponent correctly
  return static_cast<std::uint16_t>(sign | h);
}
float f16_to_float(std::uint16_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

}  // namespace

std::vector<std::uint8_t> encode(DType dtype, const std::vector<double>& values) {
  std::vector<std::uint8_t> out(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    float f = static_cast<float>(values[i]);
    if (dtype == DType::f32) {
      std::memcpy(&out[i * 4], &f, 4);
    } else {
      std::uint16_t h = dtype == DType::bf16 ? float_to_bf16(f) : float_to_f16(f);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<double> decode(DType dtype, const std::vector<std::uint8_t>& bytes) {
  const std::size_t size = dtype_size(dtype), count = bytes.size() / size;
  std::vector<double> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      out[i] = f;
    } else {
      std::uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      out[i] = dtype == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return out;
}

std::vector<double> round_to(DType dtype, const std::vector<double>& values) {
  return decode(dtype, encode(dtype, values));
}

std::vector<double> random_values(DType dtype, std::size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(count);
  for (auto& x : v) x = u(rng);
  return round_to(dtype, v);
}

Sizes sizes(const Problem& p, Op op) {
  const std::int64_t C = p.layout->rows() * p.block, K = p.layout->cols() * p.block;
  const std::int64_t w = p.layout->blocks() * p.block * p.block;
  switch (op) {
    case Op::forward: return {p.n * C, w, p.n * K};
    case Op::backward_data: return {p.n * K, w, p.n * C};
    case Op::backward_weight: return {p.n * C, p.n * K, w};
  }
  return {};
}

std::vector<double> matmul(const Problem& p, Op op, const std::vector<double>& a, const std::vector<double>& b,
                           const std::vector<double>* before, const std::vector<float>& gate) {
  const Layout& L = *p.layout;
  const std::int64_t bs = p.block, C = L.rows() * bs, K = L.cols() * bs, n = p.n;
  const bool last = p.feature_axis == FeatureAxis::last;
  // element (row m of N, feature f) of an [N, F] or [F, N] array
  auto at = [&](const std::vector<double>& v, std::int64_t m, std::int64_t f, std::int64_t F) {
    return last ? v[m * F + f] : v[f * n + m];
  };
  auto index = [&](std::int64_t m, std::int64_t f, std::int64_t F) { return last ? m * F + f : f * n + m; };
  auto g = [&](std::int64_t blk) { return gate.empty() ? 1.0 : static_cast<double>(gate[blk]); };

  // Rows of the result in chunks over the cores; each element's sum runs in the same order on any
  // number of threads (a GPU test's layer of 2048 × 2051 at N = 4099 took 15 s on one core).
  constexpr std::int64_t kChunk = 16;
  auto over_rows = [](std::int64_t rows, auto fn) {
    runtime::parallel_for(static_cast<std::size_t>((rows + kChunk - 1) / kChunk), 0, [&](std::size_t i) {
      const std::int64_t r0 = static_cast<std::int64_t>(i) * kChunk;
      fn(r0, std::min(rows, r0 + kChunk));
    });
  };
  std::vector<double> out;
  if (op == Op::backward_weight) {
    // dense Xᵀ·dY [C, K], then the layout's blocks of it
    std::vector<double> dense(C * K, 0.0);
    over_rows(C, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t m = 0; m < n; ++m)
        for (std::int64_t c = c0; c < c1; ++c) {
          double x = at(a, m, c, C);
          if (x == 0.0) continue;
          double* row = &dense[c * K];
          for (std::int64_t k = 0; k < K; ++k) row[k] += x * at(b, m, k, K);
        }
    });
    out.assign(L.blocks() * bs * bs, 0.0);
    for (std::int64_t blk = 0; blk < L.blocks(); ++blk) {
      auto [r, c] = L.block_coord(blk);
      for (std::int64_t i = 0; i < bs; ++i)
        for (std::int64_t j = 0; j < bs; ++j)
          out[(blk * bs + i) * bs + j] = g(blk) * dense[(r * bs + i) * K + c * bs + j];
    }
  } else {
    // dense W [C, K] with the mask expanded (zeros outside the layout's blocks)
    std::vector<double> W(C * K, 0.0);
    for (std::int64_t blk = 0; blk < L.blocks(); ++blk) {
      auto [r, c] = L.block_coord(blk);
      for (std::int64_t i = 0; i < bs; ++i)
        for (std::int64_t j = 0; j < bs; ++j) W[(r * bs + i) * K + c * bs + j] = g(blk) * b[(blk * bs + i) * bs + j];
    }
    const bool fwd = op == Op::forward;
    const std::int64_t in = fwd ? C : K, outf = fwd ? K : C;
    out.assign(n * outf, 0.0);
    over_rows(n, [&](std::int64_t m0, std::int64_t m1) {
      std::vector<double> row(outf);
      for (std::int64_t m = m0; m < m1; ++m) {
        std::fill(row.begin(), row.end(), 0.0);
        for (std::int64_t i = 0; i < in; ++i) {
          double x = at(a, m, i, in);
          if (x == 0.0) continue;
          if (fwd) {
            const double* w = &W[i * K];
            for (std::int64_t k = 0; k < K; ++k) row[k] += x * w[k];
          } else {
            for (std::int64_t c = 0; c < C; ++c) row[c] += x * W[c * K + i];
          }
        }
        for (std::int64_t f = 0; f < outf; ++f) out[index(m, f, outf)] = row[f];
      }
    });
  }
  if (before)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += (*before)[i];
  return out;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

}  // namespace bsjit::reference
