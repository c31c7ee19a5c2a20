#include "src/base/elf_probe.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trafficrate {
namespace {

// Bounds on what is read, whatever the file claims: real programs have a
// dozen program headers, a few dozen sections and a few hundred bytes of
// section names (Go's: 13, 25-40, ~300).
constexpr size_t kMaxProgramHeaders = 256;  // 14 KiB
constexpr size_t kMaxSections = 1024;       // 64 KiB
constexpr size_t kMaxSectionNames = 16384;
constexpr size_t kMaxNoteSegments = 8;
constexpr size_t kMaxNoteBytes = 4096;  // per PT_NOTE segment
constexpr size_t kMaxInterpreter = 4096;
constexpr size_t kScriptLine = 256;  // the kernel reads this much of "#!"
// Every offset handed to `read` stays below this (pread's off_t).
constexpr uint64_t kMaxOffset = uint64_t{1} << 62;

constexpr uint32_t kGoBuildIdNote = 4;  // cmd/link: ELF_NOTE_GOBUILDID_TAG
constexpr const char* kGoSections[] = {".go.buildinfo", ".note.go.buildid",
                                       ".gopclntab"};

#if defined(__x86_64__)
constexpr int kOurMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kOurMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr int kOurMachine = EM_386;
#elif defined(__arm__)
constexpr int kOurMachine = EM_ARM;
#elif defined(__riscv)
constexpr int kOurMachine = EM_RISCV;
#elif defined(__powerpc64__)
constexpr int kOurMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr int kOurMachine = EM_S390;
#else
constexpr int kOurMachine = 0;  // unknown: any machine is taken as ours
#endif
constexpr int kOurClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr int kOurData =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

// The ELF types of our own class: a program of the other class is
// kOtherMachine and read no further.
#if defined(__LP64__)
using Ehdr = Elf64_Ehdr;
using Phdr = Elf64_Phdr;
using Shdr = Elf64_Shdr;
#else
using Ehdr = Elf32_Ehdr;
using Phdr = Elf32_Phdr;
using Shdr = Elf32_Shdr;
#endif

// Reads exactly `len` bytes at `offset`, or false.
bool ReadExact(ReadAtFn read, uint64_t offset, void* buf, size_t len) {
  if (len == 0) return true;
  if (offset >= kMaxOffset || len >= kMaxOffset - offset) return false;
  const ssize_t n = read(offset, buf, len);
  return n >= 0 && static_cast<size_t>(n) == len;
}

// `count` entries of `entsize` bytes at `offset` (nothing if any is
// unreadable or count > max_count).
std::vector<unsigned char> ReadTable(ReadAtFn read, uint64_t offset,
                                     size_t count, size_t entsize,
                                     size_t max_count) {
  std::vector<unsigned char> table;
  if (count == 0 || count > max_count) return table;
  table.resize(count * entsize);
  if (!ReadExact(read, offset, table.data(), table.size())) table.clear();
  return table;
}

template <typename T>
T EntryAt(const std::vector<unsigned char>& table, size_t i) {
  T entry;
  std::memcpy(&entry, table.data() + i * sizeof(T), sizeof(T));
  return entry;
}

// The NUL-terminated string at the start of `bytes`, at most its size.
std::string CString(const char* bytes, size_t size) {
  if (size == 0) return "";  // bytes may be null (an empty vector's data())
  return std::string(bytes, strnlen(bytes, size));
}

// A PT_NOTE segment holding the Go build ID note (name "Go", type 4).
bool HasGoNote(ReadAtFn read, const Phdr& note) {
  const size_t size = note.p_filesz < kMaxNoteBytes
                          ? static_cast<size_t>(note.p_filesz)
                          : kMaxNoteBytes;
  if (size < 12) return false;
  std::vector<unsigned char> bytes(size);
  const ssize_t got =
      note.p_offset < kMaxOffset ? read(note.p_offset, bytes.data(), size) : -1;
  if (got <= 0) return false;
  const uint64_t end = static_cast<uint64_t>(got);
  const uint64_t align = note.p_align == 8 ? 8 : 4;
  auto padded = [align](uint64_t n) { return (n + align - 1) & ~(align - 1); };
  uint64_t pos = 0;
  while (pos + 12 <= end) {
    uint32_t word[3];  // namesz, descsz, type
    std::memcpy(word, bytes.data() + pos, sizeof(word));
    const uint64_t name = pos + 12;
    const uint64_t next = name + padded(word[0]) + padded(word[1]);
    if (word[0] == 3 || word[0] == 4) {
      if (name + 3 <= end && std::memcmp(bytes.data() + name, "Go", 3) == 0 &&
          word[2] == kGoBuildIdNote) {
        return true;
      }
    }
    pos = next;  // > pos: at least 12 more; the sizes are 32-bit
  }
  return false;
}

// PT_INTERP (-> kDynamic, its path) and the Go note.
void ReadProgramHeaders(ReadAtFn read, const Ehdr& header, ProgramInfo* info) {
  if (header.e_phentsize != sizeof(Phdr)) return;
  const std::vector<unsigned char> table = ReadTable(
      read, header.e_phoff, header.e_phnum, sizeof(Phdr), kMaxProgramHeaders);
  size_t notes = 0;
  for (size_t i = 0; i < table.size() / sizeof(Phdr); ++i) {
    const Phdr ph = EntryAt<Phdr>(table, i);
    if (ph.p_type == PT_INTERP && info->kind != ProgramKind::kDynamic) {
      info->kind = ProgramKind::kDynamic;
      const size_t size = ph.p_filesz < kMaxInterpreter
                              ? static_cast<size_t>(ph.p_filesz)
                              : kMaxInterpreter;
      std::vector<char> path(size);
      if (ReadExact(read, ph.p_offset, path.data(), size)) {
        info->interpreter = CString(path.data(), size);
      }
    } else if (ph.p_type == PT_NOTE && notes < kMaxNoteSegments && !info->go) {
      ++notes;
      info->go = HasGoNote(read, ph);
    }
  }
}

// A section named as the Go linker names its own.
bool HasGoSection(ReadAtFn read, const Ehdr& header) {
  if (header.e_shentsize != sizeof(Shdr) || header.e_shstrndx == SHN_UNDEF ||
      header.e_shstrndx >= header.e_shnum) {
    return false;  // also SHN_XINDEX: e_shnum is at most SHN_LORESERVE - 1
  }
  const std::vector<unsigned char> table = ReadTable(
      read, header.e_shoff, header.e_shnum, sizeof(Shdr), kMaxSections);
  if (table.empty()) return false;
  const Shdr names = EntryAt<Shdr>(table, header.e_shstrndx);
  const size_t size = names.sh_size < kMaxSectionNames
                          ? static_cast<size_t>(names.sh_size)
                          : kMaxSectionNames;
  std::vector<char> text(size);
  if (size == 0 || !ReadExact(read, names.sh_offset, text.data(), size)) {
    return false;
  }
  for (size_t i = 0; i < table.size() / sizeof(Shdr); ++i) {
    const uint32_t at = EntryAt<Shdr>(table, i).sh_name;
    if (at >= size) continue;
    const absl::string_view name(text.data() + at,
                                 strnlen(text.data() + at, size - at));
    for (const char* go : kGoSections) {
      if (name == go) return true;
    }
  }
  return false;
}

// "#!  /bin/sh -e" -> "/bin/sh".
std::string ScriptInterpreter(const char* line, size_t len) {
  size_t i = 2;
  while (i < len && (line[i] == ' ' || line[i] == '\t')) ++i;
  size_t end = i;
  while (end < len && line[end] != ' ' && line[end] != '\t' &&
         line[end] != '\n' && line[end] != '\0') {
    ++end;
  }
  return std::string(line + i, end - i);
}

}  // namespace

ProgramInfo InspectImage(ReadAtFn read) {
  ProgramInfo info;
  char start[kScriptLine];
  const ssize_t got = read(0, start, sizeof(start));
  if (got >= 2 && start[0] == '#' && start[1] == '!') {
    info.kind = ProgramKind::kScript;
    info.interpreter = ScriptInterpreter(start, static_cast<size_t>(got));
    return info;
  }
  if (got < static_cast<ssize_t>(EI_NIDENT) ||
      std::memcmp(start, ELFMAG, SELFMAG) != 0) {
    return info;
  }
  const unsigned char* ident = reinterpret_cast<unsigned char*>(start);
  info.elf_class = ident[EI_CLASS];
  Ehdr header;
  if (ident[EI_CLASS] != kOurClass || ident[EI_DATA] != kOurData ||
      got < static_cast<ssize_t>(sizeof(header))) {
    info.kind = got < static_cast<ssize_t>(sizeof(header)) &&
                        ident[EI_CLASS] == kOurClass &&
                        ident[EI_DATA] == kOurData
                    ? ProgramKind::kNotElf  // cut short
                    : ProgramKind::kOtherMachine;
    return info;
  }
  std::memcpy(&header, start, sizeof(header));
  info.machine = header.e_machine;
  if (kOurMachine != 0 && header.e_machine != kOurMachine) {
    info.kind = ProgramKind::kOtherMachine;
    return info;
  }
  info.kind = ProgramKind::kStatic;
  ReadProgramHeaders(read, header, &info);
  if (!info.go) info.go = HasGoSection(read, header);
  return info;
}

absl::StatusOr<ProgramInfo> InspectProgram(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  const ProgramInfo info =
      InspectImage([fd](uint64_t offset, void* buf, size_t len) -> ssize_t {
        size_t done = 0;
        while (done < len) {
          const ssize_t n = pread(fd, static_cast<char*>(buf) + done,
                                  len - done, offset + done);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) return done > 0 ? static_cast<ssize_t>(done) : -1;
          if (n == 0) break;
          done += static_cast<size_t>(n);
        }
        return static_cast<ssize_t>(done);
      });
  close(fd);
  return info;
}

const char* WhyNotPaced(const ProgramInfo& info) {
  constexpr const char* kGo =
      "is a Go program: it makes its system calls itself";
  switch (info.kind) {
    case ProgramKind::kDynamic:
      return info.go ? kGo : nullptr;
    case ProgramKind::kStatic:
      return info.go ? kGo
                     : "is statically linked: the library cannot be loaded "
                       "into it";
    case ProgramKind::kOtherMachine:
      if (info.elf_class != kOurClass) {
        return kOurClass == ELFCLASS64
                   ? "is a 32-bit program: the 64-bit library cannot be "
                     "loaded into it"
                   : "is a 64-bit program: the 32-bit library cannot be "
                     "loaded into it";
      }
      return "is built for another machine: the library cannot be loaded "
             "into it";
    case ProgramKind::kScript:
    case ProgramKind::kNotElf:
      return nullptr;
  }
  return nullptr;
}

}  // namespace trafficrate
