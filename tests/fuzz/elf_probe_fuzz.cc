// libFuzzer target: the program inspector (src/base/elf_probe.h) on any bytes,
// as it reads the program `trafficrate run` and `check` are given and, in the
// library, /proc/self/exe. Checked: no crash or undefined behaviour; every
// read stays within the inspector's bounds, however the headers lie; what it
// returns agrees with itself and with the bytes.

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "src/base/elf_probe.h"
#include "tests/fuzz/fuzz_util.h"

namespace trafficrate {
namespace fuzz {
namespace {

// src/base/elf_probe.cc's bounds: the first read, program headers, the
// interpreter, 8 notes, section headers, their names.
constexpr size_t kMaxRead = 65536;
constexpr size_t kMaxAsked = 256 + 14336 + 4096 + 8 * 4096 + 65536 + 16384;
constexpr int kMaxReads = 1 + 1 + 1 + 8 + 1 + 1;

void Check(const uint8_t* data, size_t size) {
  size_t asked = 0;
  int reads = 0;
  const ProgramInfo info =
      InspectImage([&](uint64_t offset, void* buf, size_t len) -> ssize_t {
        TRAFFICRATE_FUZZ_CHECK(len <= kMaxRead);
        asked += len;
        ++reads;
        if (offset >= size) return 0;
        const size_t n = std::min<uint64_t>(len, size - offset);
        std::memcpy(buf, data + offset, n);
        return static_cast<ssize_t>(n);
      });
  TRAFFICRATE_FUZZ_CHECK(asked <= kMaxAsked);
  TRAFFICRATE_FUZZ_CHECK(reads <= kMaxReads);
  TRAFFICRATE_FUZZ_CHECK(info.interpreter.size() <= 4096);
  TRAFFICRATE_FUZZ_CHECK(info.interpreter.find('\0') == std::string::npos);
  const bool elf = size >= 4 && std::memcmp(data,
                                            "\x7f"
                                            "ELF",
                                            4) == 0;
  switch (info.kind) {
    case ProgramKind::kScript:
      TRAFFICRATE_FUZZ_CHECK(size >= 2 && data[0] == '#' && data[1] == '!');
      TRAFFICRATE_FUZZ_CHECK(!info.go && info.interpreter.size() < 256);
      break;
    case ProgramKind::kDynamic:
    case ProgramKind::kStatic:
    case ProgramKind::kOtherMachine:
      TRAFFICRATE_FUZZ_CHECK(elf);
      TRAFFICRATE_FUZZ_CHECK(info.kind == ProgramKind::kDynamic ||
                             info.interpreter.empty());
      break;
    case ProgramKind::kNotElf:
      TRAFFICRATE_FUZZ_CHECK(!info.go && info.interpreter.empty());
      break;
  }
  TRAFFICRATE_FUZZ_CHECK(!info.go || info.kind == ProgramKind::kDynamic ||
                         info.kind == ProgramKind::kStatic);
  // Said not paced exactly when the library cannot load or is bypassed.
  const bool paceable = (info.kind == ProgramKind::kDynamic && !info.go) ||
                        info.kind == ProgramKind::kScript ||
                        info.kind == ProgramKind::kNotElf;
  TRAFFICRATE_FUZZ_CHECK((WhyNotPaced(info) == nullptr) == paceable);
}

}  // namespace
}  // namespace fuzz
}  // namespace trafficrate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trafficrate::fuzz::Check(data, size);
  return 0;
}
