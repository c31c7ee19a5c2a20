// Zero-filled arrays private to the process, reserved rather than committed:
// pages are allocated only as they are first touched, so a table sized by
// the zone's capacity or the fd limit costs what is used. Copied by fork.
//
//   Entry* table = MapPrivateArray<Entry>(n);  // nullptr if it failed
//   ...
//   UnmapPrivateArray(table, n);

#ifndef TRAFFICRATE_SRC_BASE_PRIVATE_ARRAY_H_
#define TRAFFICRATE_SRC_BASE_PRIVATE_ARRAY_H_

#include <sys/mman.h>

#include <cstddef>

namespace trafficrate {

template <typename T>
T* MapPrivateArray(size_t count) {
  void* mem = mmap(nullptr, sizeof(T) * count, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return mem == MAP_FAILED ? nullptr : static_cast<T*>(mem);
}

// No-op for nullptr.
template <typename T>
void UnmapPrivateArray(T* array, size_t count) {
  if (array != nullptr) munmap(array, sizeof(T) * count);
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_PRIVATE_ARRAY_H_
