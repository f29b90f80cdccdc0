#include "baselines.hpp"

#include <cublas_v2.h>
#include <cusparse.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "bsjit/error.hpp"
#include "device_buffer.hpp"
#include "runtime/module.hpp"

namespace bsjit::bench {

using tools::DeviceBuffer;

namespace {
bool flush_before_timing = true;

// Reads a 256 MiB buffer (five times L2) on the stream: cuBLAS's isamax, whose only write is its
// 4-byte result. Afterwards L2 holds clean lines of that buffer and none of the inputs, as in a
// model whose other layers ran in between; a flush by writing would leave some 50 MB of dirty lines
// that the timed kernel's reads must first write back (one pass over 53.7 MB took 20.4 µs after
// a memset flush, see tools/probes/stream_once.cu). At some 70 µs of GPU time it also covers the
// host's few microseconds of enqueueing the timed call.
class L2Flush {
 public:
  explicit L2Flush(CUstream stream) : data_(std::size_t(256) << 20), result_(sizeof(int)) {
    BSJIT_CU(runtime::driver().cuMemsetD8(data_.ptr, 0x3c, data_.bytes));
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    cublasSetStream(handle_, reinterpret_cast<cudaStream_t>(stream));
    cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE);  // asynchronous: the result stays on the device
  }
  void operator()() {
    const auto n = static_cast<int>(data_.bytes / sizeof(float));
    if (cublasIsamax(handle_, n, static_cast<const float*>(data_.get()), 1, static_cast<int*>(result_.get())) !=
        CUBLAS_STATUS_SUCCESS)
      throw Error("cublasIsamax (the L2 flush before a timed run) failed");
  }

 private:
  DeviceBuffer data_, result_;
  cublasHandle_t handle_ = nullptr;
};
}  // namespace

// Random values in [-1, 1), as the inputs bsjit's cells get (../shared/BENCH.md asks for random
// inputs: on constant bytes the tensor cores draw less power and a GEMM runs faster, which would
// move the floor): a pool of 64 MiB drawn once per element size, copied over the buffer from an
// offset that differs per buffer.
void fill_random(DeviceBuffer& buffer, std::size_t element_size, CUstream stream) {
  static auto* pools = new std::map<std::size_t, DeviceBuffer>();  // by element size; live as long as the process
  static std::size_t calls = 0;
  const std::size_t pool_bytes = std::size_t(64) << 20;
  auto it = pools->find(element_size);
  if (it == pools->end()) {
    std::vector<std::uint8_t> host(pool_bytes);
    std::mt19937_64 rng(0x5eed + element_size);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t i = 0; i < host.size(); i += element_size) {
      const float f = u(rng);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      if (element_size == 2) {  // bf16, rounded to nearest even
        const auto half = static_cast<std::uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
        std::memcpy(&host[i], &half, 2);
      } else {
        std::memcpy(&host[i], &bits, 4);
      }
    }
    it =
        pools->emplace(std::piecewise_construct, std::forward_as_tuple(element_size), std::forward_as_tuple(pool_bytes))
            .first;
    it->second.upload(host);
  }
  const DeviceBuffer& pool = it->second;
  // a different element-aligned start in the pool for each buffer
  const std::size_t offset = (++calls * 7919 * element_size * 4099) % pool_bytes / element_size * element_size;
  for (std::size_t done = 0; done < buffer.bytes;) {
    const std::size_t from = (offset + done) % pool_bytes, n = std::min(buffer.bytes - done, pool_bytes - from);
    BSJIT_CU(runtime::driver().cuMemcpyDtoDAsync(buffer.ptr + done, pool.ptr + from, n, stream));
    done += n;
  }
  BSJIT_CU(runtime::driver().cuStreamSynchronize(stream));
}

void set_flush_before_timing(bool on) { flush_before_timing = on; }

double time_ms(const std::function<void()>& fn, CUstream stream, int warmup, int reps) {
  if (!flush_before_timing) return runtime::median_ms(fn, stream, warmup, reps);
  static auto* flush = new L2Flush(stream);  // lives as long as the process; the bench times on one stream
  return runtime::median_ms(fn, stream, warmup, reps, [&] { (*flush)(); });
}

double copy_bandwidth(CUstream stream, int reps) {
  const std::size_t bytes = std::size_t(1) << 31;  // 2 GiB each way: far beyond L2
  DeviceBuffer a(bytes), b(bytes);
  BSJIT_CU(runtime::driver().cuMemsetD8(a.ptr, 1, bytes));
  double ms = time_ms([&] { BSJIT_CU(runtime::driver().cuMemcpyDtoDAsync(b.ptr, a.ptr, bytes, stream)); }, stream, 2, reps);
  return 2.0 * bytes / (ms * 1e-3);
}

double cublas_dense_ms(std::int64_t n, std::int64_t c, std::int64_t k, Dense kind, CUstream stream, int reps) {
  const std::size_t size = kind == Dense::bf16 ? 2 : 4;
  const cudaDataType type = kind == Dense::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = kind == Dense::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DeviceBuffer x(n * c * size), w(c * k * size), y(n * k * size);
  fill_random(x, size, stream);
  fill_random(w, size, stream);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
  cublasSetStream(h, reinterpret_cast<cudaStream_t>(stream));
  const float alpha = 1, beta = 0;
  // Row-major Y = X·W is column-major Yᵀ[K,N] = Wᵀ[K,C]·Xᵀ[C,N].
  auto run = [&] {
    auto s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, k, n, c, &alpha, w.get(), type, k, x.get(), type, c, &beta,
                          y.get(), type, k, compute, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cublasGemmEx failed: {}", static_cast<int>(s)));
  };
  double ms = time_ms(run, stream, 5, reps);
  cublasDestroy(h);
  return ms;
}

void cublas_gemm_f32(const float* x, const float* w, float* y, std::int64_t n, std::int64_t c, std::int64_t k,
                     bool tf32, CUstream stream) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
  cublasSetStream(h, reinterpret_cast<cudaStream_t>(stream));
  const float alpha = 1, beta = 0;
  auto s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, k, n, c, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F, c, &beta, y,
                        CUDA_R_32F, k, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublasDestroy(h);
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cublasGemmEx failed: {}", static_cast<int>(s)));
}

double cusparse_bell_ms(const Layout& layout, int b, std::int64_t n, const void* x, void* y, CUstream stream,
                        int reps) {
  // A = Wᵀ: block row k (an output block column) holds the blocks of layout column k, padded to
  // the longest column with -1.
  const std::int64_t C = layout.rows() * b, K = layout.cols() * b;
  std::vector<std::vector<int>> per_col(layout.cols());
  for (auto& [r, c] : layout.coords()) per_col[c].push_back(r);
  std::size_t width = 1;
  for (auto& v : per_col) width = std::max(width, v.size());
  std::vector<int> col_ind(layout.cols() * width, -1);
  for (std::int64_t k = 0; k < layout.cols(); ++k)
    std::copy(per_col[k].begin(), per_col[k].end(), col_ind.begin() + k * width);
  DeviceBuffer d_ind(col_ind.size() * 4), d_val(K * width * b * 2);
  d_ind.upload(col_ind);
  fill_random(d_val, 2, stream);
  cusparseHandle_t h;
  if (cusparseCreate(&h) != CUSPARSE_STATUS_SUCCESS) throw Error("cusparseCreate failed");
  cusparseSetStream(h, reinterpret_cast<cudaStream_t>(stream));
  double result = -1;
  for (cudaDataType dt : {CUDA_R_16BF, CUDA_R_16F}) {
    cusparseSpMatDescr_t A = nullptr;
    cusparseDnMatDescr_t B = nullptr, Cm = nullptr;
    // X [n, C] row-major is Xᵀ [C, n] column-major; Y likewise.
    bool ok = cusparseCreateBlockedEll(&A, K, C, b, width * b, d_ind.get(), d_val.get(), CUSPARSE_INDEX_32I,
                                       CUSPARSE_INDEX_BASE_ZERO, dt) == CUSPARSE_STATUS_SUCCESS &&
              cusparseCreateDnMat(&B, C, n, C, const_cast<void*>(x), dt, CUSPARSE_ORDER_COL) == CUSPARSE_STATUS_SUCCESS &&
              cusparseCreateDnMat(&Cm, K, n, K, y, dt, CUSPARSE_ORDER_COL) == CUSPARSE_STATUS_SUCCESS;
    const float alpha = 1, beta = 0;
    std::size_t ws = 0;
    ok = ok && cusparseSpMM_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha,
                                       A, B, &beta, Cm, CUDA_R_32F, CUSPARSE_SPMM_BLOCKED_ELL_ALG1, &ws) ==
                   CUSPARSE_STATUS_SUCCESS;
    if (ok) {
      DeviceBuffer work(ws);
      auto run = [&] {
        auto s = cusparseSpMM(h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, B,
                              &beta, Cm, CUDA_R_32F, CUSPARSE_SPMM_BLOCKED_ELL_ALG1, work.get());
        if (s != CUSPARSE_STATUS_SUCCESS) throw Error(fmt::format("cusparseSpMM: {}", cusparseGetErrorString(s)));
      };
      try {
        result = time_ms(run, stream, 3, reps);
      } catch (const Error&) {
        result = -1;
      }
    }
    if (A) cusparseDestroySpMat(A);
    if (B) cusparseDestroyDnMat(B);
    if (Cm) cusparseDestroyDnMat(Cm);
    if (result > 0) break;
  }
  cusparseDestroy(h);
  return result;
}

std::vector<std::uint16_t> random_bf16_bits(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint16_t> out(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : out) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float f = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<std::uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
  return out;
}

}  // namespace bsjit::bench
