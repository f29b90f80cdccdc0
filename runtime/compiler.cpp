#include "compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string_view>

#include "bsjit/error.hpp"
#include "generator/templates.hpp"

namespace bsjit::runtime {
namespace {

void check_nvrtc(nvrtcResult r, const char* call) {
  if (r != NVRTC_SUCCESS) throw Error(fmt::format("bsjit: {} failed: {}", call, nvrtcGetErrorString(r)));
}
#define BSJIT_NVRTC(call) check_nvrtc((call), #call)

struct Program {
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle) nvrtcDestroyProgram(&handle);
  }
};

std::string dump_source(const std::string& source, const std::string& label) {
  std::error_code ec;
  auto dir = std::filesystem::temp_directory_path(ec);
  if (ec) return "(not written)";
  auto path = dir / fmt::format("bsjit-{}-{}.cu", label, std::hash<std::string>{}(source));
  std::ofstream out(path);
  out << source;
  return out ? path.string() : "(not written)";
}

}  // namespace

void check_arch(const std::string& arch) {
  static const std::regex kArch("sm_([0-9]{2,4})(a|f)?");  // (at most 4 digits: no number that overflows)
  std::smatch m;
  if (!std::regex_match(arch, m, kArch) || std::stoi(m[1].str()) < 80)
    throw Error(fmt::format("target architecture '{}' is not supported; expected sm_80 or newer, e.g. sm_80, "
                            "sm_90 or sm_90a",
                            arch));
}

std::string default_kernel_arch(const std::string& device_arch) {
  return device_arch == "sm_90" ? "sm_90a" : device_arch;
}

// -minimal leaves out of the front end what no bsjit kernel uses (texture and surface functions,
// the device runtime, device-side launches, the runtime's types): the cubins stay byte for byte
// the same (229 kernels of the example manifests, both archs), and a cold compile on the 2-core
// machine took 4-12% less in the geometric mean of `bsjit-bench --suite compile` (two rounds),
// most on the Hopper matmul kernels (medians: tma2 forward 575 → 404 ms, tile128 backward-weight
// 1939 → 1608, grp2 forward 937 → 824), the attention kernels within the noise. NVRTC has it
// since 12.4; older ones compile without it.
std::vector<std::string> compile_options(const std::string& arch) {
  static const bool minimal = [] {
    int major = 0, minor = 0;
    return nvrtcVersion(&major, &minor) == NVRTC_SUCCESS && (major > 12 || (major == 12 && minor >= 4));
  }();
  std::vector<std::string> options{"--gpu-architecture=" + arch, "-std=c++17"};
  if (minimal) options.emplace_back("-minimal");
  return options;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  BSJIT_NVRTC(nvrtcVersion(&major, &minor));
  return fmt::format("{}.{}", major, minor);
}

CompiledKernel compile(const std::string& source, const std::string& name_expression, const std::string& label,
                       const std::string& arch, DriverCache driver_cache) {
  check_arch(arch);
  auto start = std::chrono::steady_clock::now();
  const auto& templates = generator::embedded_templates();
  std::vector<const char*> header_text, header_names;
  for (const auto& t : templates) {
    header_text.push_back(t.contents.c_str());
    header_names.push_back(t.include_name.c_str());
  }
  Program p;
  BSJIT_NVRTC(nvrtcCreateProgram(&p.handle, source.c_str(), (label + ".cu").c_str(), static_cast<int>(templates.size()),
                                 header_text.data(), header_names.data()));
  BSJIT_NVRTC(nvrtcAddNameExpression(p.handle, name_expression.c_str()));

  CompiledKernel k;
  k.arch = arch;
  k.options = compile_options(arch);
  if (driver_cache == DriverCache::bypass) k.options.push_back("--no-cache");
  std::vector<const char*> opts;
  for (auto& o : k.options) opts.push_back(o.c_str());
  nvrtcResult result = nvrtcCompileProgram(p.handle, static_cast<int>(opts.size()), opts.data());
  std::size_t log_size = 0;
  nvrtcGetProgramLogSize(p.handle, &log_size);
  if (log_size > 1) {
    k.log.resize(log_size);
    nvrtcGetProgramLog(p.handle, k.log.data());
    k.log.resize(log_size - 1);
  }
  if (result != NVRTC_SUCCESS) {
    throw Error(fmt::format("bsjit: NVRTC failed to compile kernel {} for {}: {}\noptions: {}\ngenerated source: {}\n"
                            "log:\n{}",
                            label, arch, nvrtcGetErrorString(result), fmt::join(k.options, " "),
                            dump_source(source, label), k.log));
  }
  const char* lowered = nullptr;
  BSJIT_NVRTC(nvrtcGetLoweredName(p.handle, name_expression.c_str(), &lowered));
  k.lowered_name = lowered;
  std::size_t size = 0;
  BSJIT_NVRTC(nvrtcGetCUBINSize(p.handle, &size));
  k.cubin.resize(size);
  BSJIT_NVRTC(nvrtcGetCUBIN(p.handle, k.cubin.data()));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  spdlog::debug("bsjit: compiled {} for {} in {:.1f} ms ({} bytes)", label, arch, ms, size);
  if (const std::string losses = performance_losses(k.log); !losses.empty())
    spdlog::warn("bsjit: ptxas, compiling {} for {}:\n{}", label, arch, losses);
  return k;
}

std::string performance_losses(const std::string& log) {
  std::string out;
  std::size_t begin = 0;
  while (begin < log.size()) {
    std::size_t end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    const std::string_view line(log.data() + begin, end - begin);
    if (line.find("Potential Performance Loss") != std::string_view::npos) {
      if (!out.empty()) out += '\n';
      out += line;
    }
    begin = end + 1;
  }
  return out;
}

}  // namespace bsjit::runtime
