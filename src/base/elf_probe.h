// What kind of program a file is, as far as LD_PRELOAD is concerned: does
// the dynamic loader run for it (so that libtrafficrate.so is loaded), and
// does it make its socket calls through libc (so that they are interposed)?
//
//   absl::StatusOr<ProgramInfo> info = InspectProgram("/usr/bin/caddy");
//   if (info.ok() && WhyNotPaced(*info) != nullptr) ...  // "is a Go
//   program..."
//
// It reads the ELF header, the program headers (PT_INTERP: the dynamic
// loader; PT_NOTE: the Go build ID note) and the section headers with their
// names (.go.buildinfo, .note.go.buildid): a few KB in a few reads. Any file
// may be given: every offset, size and count read from it is checked
// against fixed bounds and the bytes actually read, nothing is trusted, and
// a malformed file is reported as what could be told of it, never an error.
//
// Plain code: no dlsym, no interposed call; the library calls it once per
// process at start-up (on /proc/self/exe), the CLI on the program it runs.

#ifndef TRAFFICRATE_SRC_BASE_ELF_PROBE_H_
#define TRAFFICRATE_SRC_BASE_ELF_PROBE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/attributes.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace trafficrate {

enum class ProgramKind {
  kDynamic,       // an ELF program with a PT_INTERP: the dynamic loader runs
  kStatic,        // an ELF program without one (static, static-pie)
  kOtherMachine,  // ELF of another class, byte order or machine than ours
  kScript,        // starts with "#!": the kernel runs its interpreter
  kNotElf,        // anything else (execvp runs it with /bin/sh)
};

struct ProgramInfo {
  ProgramKind kind = ProgramKind::kNotElf;
  // Built by the Go toolchain (a .go.buildinfo or .note.go.buildid section,
  // or the Go build ID note): it makes its system calls itself, dynamically
  // linked (cgo) or not. Only for kDynamic and kStatic.
  bool go = false;
  // kDynamic: PT_INTERP's path; kScript: the "#!" line's first word. May be
  // empty or cut short in a malformed file.
  std::string interpreter;
  // kOtherMachine: e_ident[EI_CLASS] (1: 32-bit, 2: 64-bit) and e_machine
  // (0 when the byte order is not ours).
  int elf_class = 0;
  int machine = 0;
};

// Reads up to `len` bytes at `offset` into `buf`; returns the number read
// (fewer at the end of the file, 0 past it) or -1.
using ReadAtFn =
    absl::FunctionRef<ssize_t(uint64_t offset, void* buf, size_t len)>;

// Inspects an image through `read`. Never fails: what cannot be read or
// makes no sense is left out (a truncated ELF header is kNotElf, missing
// section headers leave `go` false). Reads at most about 100 KB in all,
// whatever the file says.
ProgramInfo InspectImage(ReadAtFn read);

// Inspects the file at `path` (opened read-only, O_CLOEXEC; a few preads).
// Errors: the file cannot be opened (NotFound, PermissionDenied...) or is
// not a regular file (FailedPrecondition), naming the path.
ABSL_MUST_USE_RESULT absl::StatusOr<ProgramInfo> InspectProgram(
    const std::string& path);

// Why the library cannot pace the program's connections, as words that
// follow its name ("is a Go program: it makes its system calls itself"),
// or nullptr when nothing known stands in the way (kDynamic without Go, a
// script or not ELF: what a script starts is what matters, and it gets
// LD_PRELOAD too).
const char* WhyNotPaced(const ProgramInfo& info);

// Where the documentation says what to do: appended to every line that says a
// program will not be paced.
inline constexpr char kBypassHelp[] =
    "see \"Programs that bypass libc\" in docs/how-it-works.md, or "
    "`trafficrate help "
    "limits`";

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_ELF_PROBE_H_
