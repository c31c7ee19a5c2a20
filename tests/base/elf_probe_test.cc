// The program inspector (src/base/elf_probe.h): real programs of each kind, and
// images made here, whole, cut short and hostile.

#include "src/base/elf_probe.h"

#include <elf.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What the inspector may read of any image, in all (src/base/elf_probe.cc's
// bounds: program headers, section headers, names, notes, interpreter).
constexpr size_t kMaxReadBytes = 256 + 14336 + 65536 + 16384 + 8 * 4096 + 4096;

// An image in memory, read through InspectImage, counting what was asked.
struct Image {
  std::string bytes;
  size_t asked = 0;
  int reads = 0;

  ProgramInfo Inspect() {
    asked = 0;
    reads = 0;
    return InspectImage([this](uint64_t offset, void* buf, size_t len) {
      asked += len;
      ++reads;
      if (offset >= bytes.size()) return ssize_t{0};
      const size_t n = std::min<size_t>(len, bytes.size() - offset);
      std::memcpy(buf, bytes.data() + offset, n);
      return static_cast<ssize_t>(n);
    });
  }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

template <typename T>
void Put(std::string* image, size_t offset, const T& value) {
  if (image->size() < offset + sizeof(T)) image->resize(offset + sizeof(T));
  std::memcpy(image->data() + offset, &value, sizeof(T));
}

// A minimal ELF image of our machine: the header, `phdrs` program headers
// at 64, and nothing else unless the test adds it.
std::string ElfImage(uint16_t phdrs) {
  Elf64_Ehdr h{};
  std::memcpy(h.e_ident, ELFMAG, SELFMAG);
  h.e_ident[EI_CLASS] = ELFCLASS64;
  h.e_ident[EI_DATA] = ELFDATA2LSB;
  h.e_ident[EI_VERSION] = EV_CURRENT;
  h.e_type = ET_EXEC;
  h.e_machine = EM_X86_64;
  h.e_version = EV_CURRENT;
  h.e_ehsize = sizeof(h);
  h.e_phoff = sizeof(h);
  h.e_phentsize = sizeof(Elf64_Phdr);
  h.e_phnum = phdrs;
  std::string image;
  Put(&image, 0, h);
  image.resize(sizeof(h) + phdrs * sizeof(Elf64_Phdr));
  return image;
}

Elf64_Ehdr Header(const std::string& image) {
  Elf64_Ehdr h;
  std::memcpy(&h, image.data(), sizeof(h));
  return h;
}

// A PT_NOTE at `at` holding one note: name `name`, type `type`, 8 bytes of
// description.
void AddNote(std::string* image, int phdr, uint64_t at, const char* name,
             uint32_t type) {
  const uint32_t namesz = std::strlen(name) + 1;
  const uint32_t padded = (namesz + 3) & ~3u;
  Put(image, at, namesz);
  Put(image, at + 4, uint32_t{8});
  Put(image, at + 8, type);
  image->resize(at + 12 + padded + 8);
  std::memcpy(image->data() + at + 12, name, namesz);
  Elf64_Phdr ph{};
  ph.p_type = PT_NOTE;
  ph.p_offset = at;
  ph.p_filesz = 12 + padded + 8;
  ph.p_align = 4;
  Put(image, sizeof(Elf64_Ehdr) + phdr * sizeof(Elf64_Phdr), ph);
}

void AddInterpreter(std::string* image, int phdr, uint64_t at,
                    const std::string& path) {
  image->resize(std::max<size_t>(image->size(), at + path.size() + 1));
  std::memcpy(image->data() + at, path.c_str(), path.size() + 1);
  Elf64_Phdr ph{};
  ph.p_type = PT_INTERP;
  ph.p_offset = at;
  ph.p_filesz = path.size() + 1;
  Put(image, sizeof(Elf64_Ehdr) + phdr * sizeof(Elf64_Phdr), ph);
}

// Section headers at `at`: a null section, then one named by each of
// `names` (the last one holds the names).
void AddSections(std::string* image, uint64_t at,
                 const std::vector<std::string>& names) {
  std::string table(1, '\0');
  std::vector<uint32_t> offsets;
  for (const std::string& n : names) {
    offsets.push_back(table.size());
    table += n + '\0';
  }
  const uint64_t names_at = at + (names.size() + 1) * sizeof(Elf64_Shdr);
  for (size_t i = 0; i < names.size(); ++i) {
    Elf64_Shdr sh{};
    sh.sh_name = offsets[i];
    sh.sh_type = i + 1 == names.size() ? SHT_STRTAB : SHT_PROGBITS;
    if (i + 1 == names.size()) {
      sh.sh_offset = names_at;
      sh.sh_size = table.size();
    }
    Put(image, at + (i + 1) * sizeof(Elf64_Shdr), sh);
  }
  image->resize(names_at + table.size());
  std::memcpy(image->data() + names_at, table.data(), table.size());
  Elf64_Ehdr h = Header(*image);
  h.e_shoff = at;
  h.e_shentsize = sizeof(Elf64_Shdr);
  h.e_shnum = names.size() + 1;
  h.e_shstrndx = names.size();
  Put(image, 0, h);
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents)
      : path_(
            absl::StrCat(::testing::TempDir(), "/elf_probe_test.", getpid())) {
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

#if defined(__x86_64__)

TEST(ElfProbeTest, DynamicProgramHasItsLoader) {
  absl::StatusOr<ProgramInfo> info = InspectProgram("/bin/true");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ProgramKind::kDynamic);
  EXPECT_FALSE(info->go);
  EXPECT_EQ(info->interpreter, "/lib64/ld-linux-x86-64.so.2");
  EXPECT_EQ(WhyNotPaced(*info), nullptr);
}

TEST(ElfProbeTest, StaticProgramIsNotPaced) {
  if (std::strlen(TRAFFICRATE_STATIC_HELLO) == 0) {
    GTEST_SKIP() << "no libc.a: static_hello was not built";
  }
  absl::StatusOr<ProgramInfo> info = InspectProgram(TRAFFICRATE_STATIC_HELLO);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ProgramKind::kStatic);
  EXPECT_FALSE(info->go);
  EXPECT_TRUE(info->interpreter.empty());
  ASSERT_NE(WhyNotPaced(*info), nullptr);
  EXPECT_THAT(WhyNotPaced(*info), StartsWith("is statically linked"));
}

TEST(ElfProbeTest, GoBuildInfoSectionMakesAGoProgram) {
  absl::StatusOr<ProgramInfo> info = InspectProgram(TRAFFICRATE_FAKE_GO);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ProgramKind::kDynamic);
  EXPECT_TRUE(info->go);
  ASSERT_NE(WhyNotPaced(*info), nullptr);
  EXPECT_THAT(WhyNotPaced(*info), StartsWith("is a Go program"));
}

TEST(ElfProbeTest, RealGoProgram) {
  if (access("/usr/bin/caddy", R_OK) != 0) {
    GTEST_SKIP() << "no /usr/bin/caddy (Debian's caddy, a Go program)";
  }
  absl::StatusOr<ProgramInfo> info = InspectProgram("/usr/bin/caddy");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ProgramKind::kDynamic);  // cgo: libc for the resolver
  EXPECT_TRUE(info->go);
  EXPECT_THAT(WhyNotPaced(*info), StartsWith("is a Go program"));
}

#endif  // __x86_64__

TEST(ElfProbeTest, ReadsLittle) {
  // Our own test program: a few reads, a few KB.
  Image self{ReadFile("/proc/self/exe")};
  ASSERT_GT(self.bytes.size(), 4096u);
  const ProgramInfo info = self.Inspect();
  EXPECT_EQ(info.kind, ProgramKind::kDynamic);
  EXPECT_FALSE(info.go);
  EXPECT_LE(self.reads, 8);
  EXPECT_LT(self.asked, 32768u);
}

TEST(ElfProbeTest, ScriptsNameTheirInterpreter) {
  for (const auto& [text, interpreter] :
       std::vector<std::pair<std::string, std::string>>{
           {"#!/bin/sh\necho hi\n", "/bin/sh"},
           {"#! \t/usr/bin/env python3 -u\n", "/usr/bin/env"},
           {"#!", ""},
           {"#!/bin/" + std::string(1000, 'x'),
            "/bin/" + std::string(249, 'x')},
       }) {
    Image script{text};
    const ProgramInfo info = script.Inspect();
    EXPECT_EQ(info.kind, ProgramKind::kScript) << text;
    EXPECT_EQ(info.interpreter, interpreter) << text;
    EXPECT_EQ(WhyNotPaced(info), nullptr);
  }
}

TEST(ElfProbeTest, AnythingElseIsNotElf) {
  for (const std::string& text :
       {std::string(), std::string("#"), std::string("hello world\n"),
        std::string("\x7f"
                    "ELF"),
        std::string("\x7f"
                    "ELF\x02\x01\x01",
                    7),
        std::string(4096, '\0')}) {
    Image image{text};
    const ProgramInfo info = image.Inspect();
    EXPECT_EQ(info.kind, ProgramKind::kNotElf) << text.size();
    EXPECT_EQ(WhyNotPaced(info), nullptr);
  }
}

TEST(ElfProbeTest, ReadErrorIsNotElf) {
  const ProgramInfo info =
      InspectImage([](uint64_t, void*, size_t) { return ssize_t{-1}; });
  EXPECT_EQ(info.kind, ProgramKind::kNotElf);
}

#if defined(__x86_64__)

TEST(ElfProbeTest, OtherWordSizeOrMachineCannotLoadTheLibrary) {
  Image i386{ElfImage(0)};
  i386.bytes[EI_CLASS] = ELFCLASS32;
  ProgramInfo info = i386.Inspect();
  EXPECT_EQ(info.kind, ProgramKind::kOtherMachine);
  EXPECT_THAT(WhyNotPaced(info), StartsWith("is a 32-bit program"));

  Image arm{ElfImage(0)};
  Elf64_Ehdr h = Header(arm.bytes);
  h.e_machine = EM_AARCH64;
  Put(&arm.bytes, 0, h);
  info = arm.Inspect();
  EXPECT_EQ(info.kind, ProgramKind::kOtherMachine);
  EXPECT_EQ(info.machine, EM_AARCH64);
  EXPECT_THAT(WhyNotPaced(info), StartsWith("is built for another machine"));

  Image big_endian{ElfImage(0)};
  big_endian.bytes[EI_DATA] = ELFDATA2MSB;
  EXPECT_EQ(big_endian.Inspect().kind, ProgramKind::kOtherMachine);
}

TEST(ElfProbeTest, MadeImages) {
  Image image{ElfImage(2)};
  EXPECT_EQ(image.Inspect().kind, ProgramKind::kStatic);

  AddInterpreter(&image.bytes, 0, 512, "/lib/ld-test.so");
  ProgramInfo info = image.Inspect();
  EXPECT_EQ(info.kind, ProgramKind::kDynamic);
  EXPECT_EQ(info.interpreter, "/lib/ld-test.so");
  EXPECT_FALSE(info.go);

  // Go's build ID note, section headers stripped.
  AddNote(&image.bytes, 1, 600, "GNU", 3);
  EXPECT_FALSE(image.Inspect().go);
  AddNote(&image.bytes, 1, 600, "Go", 4);
  EXPECT_TRUE(image.Inspect().go);
  AddNote(&image.bytes, 1, 600, "Go", 3);  // not the build ID
  EXPECT_FALSE(image.Inspect().go);

  for (const char* name : {".go.buildinfo", ".note.go.buildid", ".gopclntab"}) {
    Image sections{ElfImage(0)};
    AddSections(&sections.bytes, 1024, {".text", name, ".shstrtab"});
    info = sections.Inspect();
    EXPECT_EQ(info.kind, ProgramKind::kStatic);
    EXPECT_TRUE(info.go) << name;
    EXPECT_THAT(WhyNotPaced(info), StartsWith("is a Go program"));
  }
  Image plain{ElfImage(0)};
  AddSections(&plain.bytes, 1024,
              {".text", ".go.buildinfo2", ".go", ".shstrtab"});
  EXPECT_FALSE(plain.Inspect().go);
}

// Every count, offset and size at its worst: nothing is read beyond the
// bounds, and what can still be told is.
TEST(ElfProbeTest, HostileHeadersAreBounded) {
  Image base{ElfImage(1)};
  AddInterpreter(&base.bytes, 0, 512, "/lib/ld.so");
  AddSections(&base.bytes, 1024, {".go.buildinfo", ".shstrtab"});
  ASSERT_TRUE(base.Inspect().go);

  struct Case {
    const char* what;
    void (*change)(Elf64_Ehdr*);
  };
  const Case kCases[] = {
      {"phnum max", [](Elf64_Ehdr* h) { h->e_phnum = 0xffff; }},
      {"phoff far", [](Elf64_Ehdr* h) { h->e_phoff = ~uint64_t{0} - 8; }},
      {"phoff past end", [](Elf64_Ehdr* h) { h->e_phoff = 1 << 20; }},
      {"phentsize", [](Elf64_Ehdr* h) { h->e_phentsize = 1; }},
      {"shnum max", [](Elf64_Ehdr* h) { h->e_shnum = 0xffff; }},
      {"shnum 0", [](Elf64_Ehdr* h) { h->e_shnum = 0; }},
      {"shoff far", [](Elf64_Ehdr* h) { h->e_shoff = ~uint64_t{0}; }},
      {"shentsize", [](Elf64_Ehdr* h) { h->e_shentsize = 0; }},
      {"shstrndx", [](Elf64_Ehdr* h) { h->e_shstrndx = 0xffff; }},
      {"shstrndx null", [](Elf64_Ehdr* h) { h->e_shstrndx = 0; }},
  };
  for (const Case& c : kCases) {
    Image image{base.bytes};
    Elf64_Ehdr h = Header(image.bytes);
    c.change(&h);
    Put(&image.bytes, 0, h);
    image.Inspect();
    EXPECT_LE(image.asked, kMaxReadBytes) << c.what;
  }

  // The interpreter and the names: sizes and offsets far out.
  Image image{base.bytes};
  Elf64_Phdr ph;
  std::memcpy(&ph, image.bytes.data() + 64, sizeof(ph));
  ph.p_filesz = ~uint64_t{0};
  Put(&image.bytes, 64, ph);
  ProgramInfo info = image.Inspect();
  EXPECT_EQ(info.kind, ProgramKind::kDynamic);
  EXPECT_TRUE(info.interpreter.empty());  // could not read 4 KiB there
  EXPECT_LE(image.asked, kMaxReadBytes);
  ph.p_offset = ~uint64_t{0};
  Put(&image.bytes, 64, ph);
  EXPECT_EQ(image.Inspect().kind, ProgramKind::kDynamic);

  const size_t names_header = 1024 + 2 * sizeof(Elf64_Shdr);
  Elf64_Shdr names;
  std::memcpy(&names, image.bytes.data() + names_header, sizeof(names));
  names.sh_size = ~uint64_t{0};
  Put(&image.bytes, names_header, names);
  image.Inspect();
  EXPECT_LE(image.asked, kMaxReadBytes);
  names.sh_size = 3;  // cuts ".go.buildinfo" short
  Put(&image.bytes, names_header, names);
  EXPECT_FALSE(image.Inspect().go);

  // A note that claims more than there is, and one of 4 GiB.
  Image notes{ElfImage(1)};
  AddNote(&notes.bytes, 0, 512, "Go", 4);
  Put(&notes.bytes, 512, uint32_t{0xffffffff});
  EXPECT_FALSE(notes.Inspect().go);
  Put(&notes.bytes, 512, uint32_t{3});
  Put(&notes.bytes, 516, uint32_t{0xfffffff0});
  EXPECT_TRUE(notes.Inspect().go);  // the name came first
  EXPECT_LE(notes.asked, kMaxReadBytes);
}

#endif  // __x86_64__

// Every prefix of real programs and random bytes after a valid header:
// nothing crashes, nothing reads beyond the bounds.
TEST(ElfProbeTest, CutShortAndGarbage) {
  std::vector<std::string> programs = {ReadFile("/proc/self/exe"),
                                       ReadFile(TRAFFICRATE_FAKE_GO)};
  if (std::strlen(TRAFFICRATE_STATIC_HELLO) != 0) {
    programs.push_back(ReadFile(TRAFFICRATE_STATIC_HELLO));
  }
  for (const std::string& program : programs) {
    ASSERT_GT(program.size(), 4096u);
    for (size_t n = 0; n < 8192; n += n < 128 ? 1 : 61) {
      Image cut{program.substr(0, n)};
      cut.Inspect();
      EXPECT_LE(cut.asked, kMaxReadBytes);
    }
    // The tail cut off: section headers are at the end.
    Image no_tail{program.substr(0, program.size() - 100)};
    no_tail.Inspect();
    EXPECT_LE(no_tail.asked, kMaxReadBytes);
  }
  std::mt19937_64 random(20261207);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = programs[i % programs.size()].substr(0, 16384);
    const int flips = 1 + i % 64;
    for (int f = 0; f < flips; ++f) {
      // Mostly in the headers, where offsets and counts are.
      const size_t at = random() % (f % 2 == 0 ? 128 : bytes.size());
      bytes[at] = static_cast<char>(random());
    }
    Image garbage{bytes};
    garbage.Inspect();
    EXPECT_LE(garbage.asked, kMaxReadBytes);
  }
}

TEST(ElfProbeTest, FilesThatCannotBeInspected) {
  absl::StatusOr<ProgramInfo> missing =
      InspectProgram("/nonexistent/elf_probe_test");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("/nonexistent/elf_probe_test"));
  absl::StatusOr<ProgramInfo> dir = InspectProgram("/");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);

  TempFile script("#!/bin/sh\nexit 0\n");
  absl::StatusOr<ProgramInfo> info = InspectProgram(script.path());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, ProgramKind::kScript);
  EXPECT_EQ(info->interpreter, "/bin/sh");
}

}  // namespace
}  // namespace trafficrate
