#include "device_tables.hpp"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <bit>

namespace bsjit::generator {

std::size_t capacity(const DeviceTable& table) {
  const std::size_t n = table.values.size();
  return std::bit_ceil(std::max<std::size_t>(n + 3 * n / 4, 64));
}

std::string declare(const DeviceTable& table) {
  // C linkage: the loader finds the symbol by its plain name (cuModuleGetGlobal); a definition in
  // an extern "C" block, since NVRTC warns that an extern declaration is taken as one (#20044). Not
  // const: the values arrive after loading, so the compiler must not fold the (zero) initial contents.
  // A pointer in constant memory, not global: the kernels cannot write it, so the compiler reads it
  // once; in global memory it was read again after every store (the attention backward's loop).
  switch (table.storage) {
    case TableStorage::pointer:
      return fmt::format("extern \"C\" {{ __constant__ int* {}; }}  // pointed at the values when loaded\n", table.name);
    case TableStorage::constant:
      return fmt::format("extern \"C\" {{ __constant__ int {}[{}]; }}  // filled when loaded\n", table.name,
                         capacity(table));
    case TableStorage::array:
      break;
  }
  return fmt::format("extern \"C\" {{ __device__ int {}[{}]; }}  // filled when loaded\n", table.name, capacity(table));
}

std::string add_table(DeviceTables& tables, std::string name, std::vector<int> values, TableStorage storage) {
  tables.push_back({std::move(name), std::move(values), storage});
  return declare(tables.back());
}

std::string tables_digest(const DeviceTables& tables) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& t : tables) {
    // length-prefixed, so that no two different lists of tables give the same bytes
    const std::string head = fmt::format("{}:{};{};", t.name.size(), t.name, t.values.size());
    XXH3_128bits_update(state, head.data(), head.size());
    XXH3_128bits_update(state, t.values.data(), t.values.size() * sizeof(int));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

std::size_t device_bytes(const DeviceTable& table) {
  return table.storage == TableStorage::pointer ? sizeof(void*) : capacity(table) * sizeof(int);
}

}  // namespace bsjit::generator
