// A layout's lookup tables as the generated source declares them and the loader fills them.
//
// The source declares each table as an uninitialized device array with C linkage, sized but
// empty; its values travel beside the cubin (runtime::CompiledKernel, the cache entry) and
// runtime::load copies them into every module it loads. Written into the source as initializers
// instead, a 65536-block layout's tables cost NVVM and ptxas 0.35-0.5 s of a 0.8-1.3 s compile and
// made its cubin 8-17× larger (docs/PERFORMANCE.md, "Where a cold compile's time goes").
// The arrays are declared with a capacity, not their length (a power of two, at least 64), so the
// sources of layouts of one shape whose tables are of similar sizes are identical, and one compile
// serves them all (cache::code_key). The capacity is the power of two at or above 1.75 times the
// length. With the length's own power of two, the tables of random layouts of one shape whose
// lengths lie near a power of two (a block count times a small constant, on power-of-two layers
// at d = 0.25 or 0.5) fell on either side of it from one layout to the next, and each side
// compiled its own kernel; 1.75 puts the boundaries at 4/7 of a power of two, away from 2^k,
// 3 · 2^k and the widths of common MLPs (11008, 14336). Over 27 shapes and densities (b = 32, 64,
// 128; 8 random layouts each; six kernels), the kernels' distinct sources went from 240 to 211,
// against 203 with no capacity in the source at all (1.5 gave 221: its boundaries at 2/3 of a power
// of two meet 11008). The capacity only reserves device memory (at most 3.5 times the values): the
// kernels' instructions do not depend on it (the cubins' text, constant banks and relocations
// compared byte for byte for seven kernels with their capacities doubled).
//
// Two other storages: a pointer (in constant memory), which the loader points at a copy of the
// values in device memory of their own, so that the source does not depend on the table's length
// at all (the attention kernels: one source for every sequence length); and an array in constant
// memory, for a few values every thread reads, such as the dims of a source that serves several
// shapes. The storage shapes the declaration only: the loader tells a pointer from an array by the
// size of the module's symbol (8 bytes; an array holds at least 64 ints), so a table read back
// from the cache, which keeps names and values, loads the same way.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace bsjit::generator {

enum class TableStorage { array, pointer, constant };

struct DeviceTable {
  std::string name;         // the array's symbol in the module: "kLut"
  std::vector<int> values;  // may be empty; the array's elements past them are never read
  TableStorage storage = TableStorage::array;
  bool operator==(const DeviceTable&) const = default;
};
using DeviceTables = std::vector<DeviceTable>;

// The number of elements table's array is declared with: 1.75 times its length rounded up to a
// power of two, at least 64.
std::size_t capacity(const DeviceTable& table);

// table's definition in generated source: `extern "C" { __device__ int kLut[64]; }`; a pointer
// `extern "C" { __constant__ int* kLut; }`; constant `extern "C" { __constant__ int kLut[64]; }`.
std::string declare(const DeviceTable& table);

// Appends table to tables and returns its declaration.
std::string add_table(DeviceTables& tables, std::string name, std::vector<int> values,
                      TableStorage storage = TableStorage::array);

// 32 hex digits: XXH3-128 of every table's name and values (part of a kernel's cache key).
std::string tables_digest(const DeviceTables& tables);

// The bytes of the table's symbol in a module: capacity × 4, or a pointer's 8. (A table read back
// from the cache is an array here; the loader knows a pointer by its symbol's 8 bytes first.)
std::size_t device_bytes(const DeviceTable& table);

}  // namespace bsjit::generator
