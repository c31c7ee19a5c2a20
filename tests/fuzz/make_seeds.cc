// Writes the seed inputs of the fuzz targets (format: fuzz_util.h) into
// DIR/<target>/: images of real zones (made with Zone::OpenOrCreate, a few
// keys, processes and connections registered through the Locked API, some
// joined), a valid value for each parser, and small programs of each kind
// for elf_probe_fuzz (a script; ELF images with an interpreter, Go's note
// and sections, made here: real programs are megabytes). scripts/fuzz.sh runs
// it before each run, so the seeds always match the current layout;
// tests/fuzz/seeds/ holds one such set, committed.
//
//   make_fuzz_seeds tests/fuzz/seeds

#include <arpa/inet.h>
#include <elf.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/fuzz/fuzz_util.h"

namespace trafficrate {
namespace fuzz {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr uint64_t kSeedHash[2] = {0x0123456789abcdefULL,
                                   0xfedcba9876543210ULL};
constexpr uint32_t kSeedRate = 500 * 1024;

bool WriteFile(const std::string& path, const Bytes& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

uint8_t V4Key(uint8_t last, uint8_t out[kKeyBytes]) {
  std::memset(out, 0, kKeyBytes);
  out[10] = out[11] = 0xff;
  out[12] = 127;
  out[15] = last;
  return last;
}

// A zone as servers leave it: keys for 127.0.0.2..5 and 2001:db8::1, three
// processes (the last one dead), connections on each, some sending.
struct SeedZone {
  Bytes image;  // the whole zone
  uint64_t hash_seed[2];
};

bool MakeZone(bool budget, SeedZone* out) {
  const std::string name = absl::StrCat("seed", getpid());
  (void)ZoneSegment::Unlink(name);
  absl::StatusOr<std::unique_ptr<Zone>> opened =
      Zone::OpenOrCreate(name, kFuzzZoneSize, kSeedRate);
  (void)ZoneSegment::Unlink(name);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
    return false;
  }
  Zone& zone = **opened;
  // A fixed seed, so that the chains are the same in every run.
  std::memcpy(zone.header().hash_seed, kSeedHash, sizeof(kSeedHash));
  if (budget) zone.settings().SetShare(ShareMode::kBudget, 0);
  std::vector<uint32_t> procs;
  {
    ZoneLock lock(zone);
    if (!lock.ok()) return false;
    for (int32_t pid : {4101, 4102, 4103}) {
      procs.push_back(zone.procs().ClaimLocked(pid, 1000 * kNsPerSec));
    }
    std::vector<uint32_t> keys;
    uint8_t key[kKeyBytes];
    for (uint8_t last = 2; last <= 5; ++last) {
      V4Key(last, key);
      keys.push_back(zone.keys().FindOrInsertLocked(key, 1000 * kNsPerSec));
    }
    uint8_t v6[kKeyBytes] = {0x20, 0x01, 0x0d, 0xb8};
    v6[15] = 1;
    keys.push_back(zone.keys().FindOrInsertLocked(v6, 1000 * kNsPerSec));
    for (uint32_t i = 0; i < 9; ++i) {
      uint8_t peer[16] = {};
      std::memcpy(peer, zone.keys().slot(keys[i % keys.size()]).key, 16);
      const uint32_t c = zone.conns().RegisterLocked(
          keys[i % keys.size()], procs[i % procs.size()],
          static_cast<int>(10 + i), peer, static_cast<uint16_t>(40000 + i));
      if (c == kNoSlot) return false;
      zone.conns().slot(c).bytes_sent.store(1000 * (i + 1));
      if (i % 3 != 2) zone.conns().JoinLocked(c);
      zone.conns().slot(c).share_bytes_per_sec.store(kSeedRate / 3);
    }
  }
  if (budget) zone.conns().SetUnderPace(0, true);
  zone.procs().slot(procs[0]).watcher_cpu.store(150);
  zone.procs().slot(procs[0]).watcher_stretch.store(100);
  const uint8_t* base = ZoneBytes(zone);
  out->image.assign(base, base + kFuzzZoneSize);
  std::memcpy(out->hash_seed, kSeedHash, sizeof(kSeedHash));
  // The image shows the last process dead (its owner's robust mutex released
  // by the kernel), the others alive (held by a thread that is not the
  // fuzzer's).
  const size_t word = ComputeZoneGeometry(kFuzzZoneSize).procs_offset +
                      sizeof(ProcSlotShm) * procs[2] +
                      offsetof(ProcSlotShm, liveness);
  int lock_word = 0;
  std::memcpy(&lock_word, out->image.data() + word, sizeof(lock_word));
  lock_word |= FUTEX_OWNER_DIED;
  std::memcpy(out->image.data() + word, &lock_word, sizeof(lock_word));
  for (const uint32_t p : procs)
    pthread_mutex_unlock(&zone.procs().slot(p).liveness);
  return true;
}

Bytes Control(InputMode mode, uint8_t flags, const uint64_t hash_seed[2],
              const Bytes& script) {
  Bytes c(kControlBytes, 0);
  c[0] = static_cast<uint8_t>(mode);
  c[1] = flags;
  std::memcpy(&c[2], hash_seed, 16);
  const uint32_t rate = kSeedRate - 1;
  std::memcpy(&c[18], &rate, sizeof(rate));
  std::memcpy(&c[kScriptOffset], script.data(),
              std::min(script.size(), kScriptBytes));
  return c;
}

Bytes Window(const SeedZone& zone) {
  Bytes out;
  for (const WindowPart& part : TableWindow()) {
    out.insert(out.end(), zone.image.begin() + part.offset,
               zone.image.begin() + part.offset + part.bytes);
  }
  return out;
}

Bytes Cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every op once or more, on the slots the seed zone uses (40 bytes).
Bytes ZoneScript() {
  constexpr uint8_t L = kLastSlot;
  // clang-format off
  return {
      kFindOrInsertKey, 7,
      kRegisterConn, L, 0, 9, 7,
      kJoin, L,
      kSetUnderPace, L, 1,
      kBudgetTick, 0, 4, 20,
      kReads, 3, 2, 50,
      kLeave, 0,
      kTransfer, 1, 1, 11,
      kReapDead,
      kSnapshot,
      kFindKey, kKeyOfSlot | 1,
      kDeregister, 1,
      kClaimProc, 5,
      kReapIfDead, 2,
      kRepair,
      kSetShare, 3,
  };
  // clang-format on
}

// --top 3 --sort bytes, 100x30, table; then JSON, Prometheus.
Bytes SnapshotScript() {
  return {3, 1, 100, 30, 0, 0, 0, 0, 0, 0, 80, 24, 1, 0, 0, 0, 2, 0, 0, 0};
}

bool WriteZoneSeeds(const std::string& dir) {
  SeedZone equal, budget;
  if (!MakeZone(false, &equal) || !MakeZone(true, &budget)) return false;
  const std::string zone_dir = dir + "/zone_fuzz";
  const std::string snap_dir = dir + "/snapshot_fuzz";
  mkdir(zone_dir.c_str(), 0755);
  mkdir(snap_dir.c_str(), 0755);
  // The raw images lose their last 64 bytes (max_len is the zone size):
  // the last process slot, which no seed uses.
  auto raw = [](const Bytes& control, const SeedZone& z) {
    Bytes image(z.image.begin(), z.image.end() - kControlBytes);
    return Cat(control, image);
  };
  const Bytes header(budget.image.begin(),
                     budget.image.begin() + sizeof(ZoneHeaderShm));
  const Bytes zs = ZoneScript();
  const Bytes ss = SnapshotScript();
  return WriteFile(zone_dir + "/raw_equal",
                   raw(Control(InputMode::kRawImage, 0, equal.hash_seed, zs),
                       equal)) &&
         WriteFile(zone_dir + "/raw_budget_open",
                   raw(Control(InputMode::kRawImage,
                               kFlagOpenOrCreate | kFlagOwnerDied,
                               budget.hash_seed, zs),
                       budget)) &&
         WriteFile(
             zone_dir + "/tables_budget",
             Cat(Control(InputMode::kTables, kFlagBudget, budget.hash_seed, zs),
                 Window(budget))) &&
         WriteFile(zone_dir + "/header_tables_repair",
                   Cat(Control(InputMode::kHeaderAndTables, kFlagOwnerDied,
                               budget.hash_seed, zs),
                       Cat(header, Window(budget)))) &&
         WriteFile(snap_dir + "/raw_budget",
                   raw(Control(InputMode::kRawImage, 0, budget.hash_seed, ss),
                       budget)) &&
         WriteFile(snap_dir + "/tables_equal",
                   Cat(Control(InputMode::kTables, 0, equal.hash_seed, ss),
                       Window(equal))) &&
         WriteFile(snap_dir + "/header_tables_budget",
                   Cat(Control(InputMode::kHeaderAndTables, kFlagBudget,
                               budget.hash_seed, ss),
                       Cat(header, Window(budget))));
}

// kConnKey, peer/24,64: a peer 127.0.0.2:8080 (sockaddr_in, padded to the
// length of the local sockaddr_in6), a local [2001:db8::1]:8080.
std::string ConnKeySeed() {
  sockaddr_in6 peer6 = {};
  sockaddr_in peer = {};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(8080);
  peer.sin_addr.s_addr = htonl(0x7f000002);
  std::memcpy(&peer6, &peer, sizeof(peer));
  sockaddr_in6 local = {};
  local.sin6_family = AF_INET6;
  local.sin6_port = htons(8080);
  inet_pton(AF_INET6, "2001:db8::1", &local.sin6_addr);
  std::string out = {'\x10', '\x01'};
  out.append(reinterpret_cast<const char*>(&peer6), sizeof(peer6));
  out.append(reinterpret_cast<const char*>(&local), sizeof(local));
  return out;
}

// One valid value per parser (config_fuzz.cc's first byte picks it).
bool WriteConfigSeeds(const std::string& dir) {
  const std::string config_dir = dir + "/config_fuzz";
  mkdir(config_dir.c_str(), 0755);
  const std::vector<std::pair<const char*, std::string>> seeds = {
      {"rate", std::string(1, '\0') + "500k"},
      {"zone_size",
       "\x01"
       "1m"},
      {"after",
       "\x02"
       "10g"},
      {"idle",
       "\x03"
       "200ms"},
      {"strict",
       "\x04"
       "1"},
      {"share",
       "\x05"
       "budget"},
      {"burst",
       "\x06"
       "64k"},
      {"log",
       "\x07"
       "/var/log/trafficrate.log"},
      {"zone",
       "\x08"
       "default"},
      {"key",
       "\x09"
       "peer/24,64"},
      {"ports",
       "\x0a"
       "80, 443,8000-8099,8050"},
      {"exempt",
       "\x0b"
       "10.1.2.3/8,127.0.0.3,2001:db8::/32,::1,::ffff:1.2.3.4"},
      {"prefix",
       "\x0c"
       "\x01"
       "64"},
      {"byte_count",
       "\x0d"
       "\x01\x0a\x28"
       "12m"},
      {"duration",
       "\x0e"
       "\x01\x09"
       "5s"},
      {"config",
       "\x0f"
       "1m\x01peer/24\x01web\x01"
       "2m\x01"
       "80\x01::1\x01"
       "1k\x01off\x01"
       "0\x01"
       "50ms\x01"
       "budget\x01"
       "32k"},
      {"conn_key", ConnKeySeed()},
  };
  for (const auto& [name, value] : seeds) {
    if (!WriteFile(config_dir + "/" + name,
                   Bytes(value.begin(), value.end()))) {
      return false;
    }
  }
  return true;
}

template <typename T>
void Put(Bytes* image, size_t offset, const T& value) {
  if (image->size() < offset + sizeof(T)) image->resize(offset + sizeof(T));
  std::memcpy(image->data() + offset, &value, sizeof(T));
}

void PutText(Bytes* image, size_t offset, absl::string_view text) {
  if (image->size() < offset + text.size()) {
    image->resize(offset + text.size());
  }
  std::memcpy(image->data() + offset, text.data(), text.size());
}

// An x86-64 ELF image: a PT_INTERP (if `interpreter`), a PT_NOTE with Go's
// build ID note (if `go_note`), and sections named `sections` (and
// .shstrtab).
Bytes ElfSeed(const char* interpreter, bool go_note,
              const std::vector<std::string>& sections) {
  Bytes image;
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
  h.e_phnum = 2;
  size_t at = sizeof(h) + 2 * sizeof(Elf64_Phdr);
  Elf64_Phdr ph{};
  if (interpreter != nullptr) {
    ph.p_type = PT_INTERP;
    ph.p_offset = at;
    ph.p_filesz = std::strlen(interpreter) + 1;
    PutText(&image, at, absl::string_view(interpreter, ph.p_filesz));
    at += (ph.p_filesz + 7) & ~size_t{7};
  }
  Put(&image, sizeof(h), ph);
  if (go_note) {
    // namesz 4 ("Go\0\0"), descsz 8, type 4 (the build ID).
    Elf64_Phdr note{};
    note.p_type = PT_NOTE;
    note.p_offset = at;
    note.p_filesz = 12 + 4 + 8;
    note.p_align = 4;
    Put(&image, sizeof(h) + sizeof(Elf64_Phdr), note);
    Put(&image, at, uint32_t{4});
    Put(&image, at + 4, uint32_t{8});
    Put(&image, at + 8, uint32_t{4});
    PutText(&image, at + 12, absl::string_view("Go\0\0buildid!", 12));
    at += note.p_filesz;
  }
  std::string names(1, '\0');
  std::vector<Elf64_Shdr> headers(1);
  for (const std::string& name : sections) {
    Elf64_Shdr sh{};
    sh.sh_name = names.size();
    sh.sh_type = SHT_PROGBITS;
    headers.push_back(sh);
    names += name + '\0';
  }
  Elf64_Shdr strtab{};
  strtab.sh_name = names.size();
  names += std::string(".shstrtab") + '\0';
  strtab.sh_type = SHT_STRTAB;
  strtab.sh_offset = at;
  strtab.sh_size = names.size();
  headers.push_back(strtab);
  PutText(&image, at, names);
  at = (at + names.size() + 7) & ~size_t{7};
  h.e_shoff = at;
  h.e_shentsize = sizeof(Elf64_Shdr);
  h.e_shnum = headers.size();
  h.e_shstrndx = headers.size() - 1;
  for (size_t i = 0; i < headers.size(); ++i) {
    Put(&image, at + i * sizeof(Elf64_Shdr), headers[i]);
  }
  Put(&image, 0, h);
  return image;
}

bool WriteElfSeeds(const std::string& dir) {
  const std::string elf_dir = dir + "/elf_probe_fuzz";
  mkdir(elf_dir.c_str(), 0755);
  const std::string script = "#!/bin/sh -e\nexec nginx\n";
  const std::vector<std::pair<const char*, Bytes>> seeds = {
      {"script", Bytes(script.begin(), script.end())},
      {"dynamic", ElfSeed("/lib64/ld-linux-x86-64.so.2", false,
                          {".interp", ".text", ".data"})},
      {"dynamic_go", ElfSeed("/lib64/ld-linux-x86-64.so.2", true,
                             {".note.go.buildid", ".text", ".go.buildinfo"})},
      {"static_go", ElfSeed(nullptr, false, {".text", ".gopclntab"})},
      {"static", ElfSeed(nullptr, false, {".text"})},
  };
  for (const auto& [name, bytes] : seeds) {
    if (!WriteFile(elf_dir + "/" + name, bytes)) return false;
  }
  return true;
}

}  // namespace
}  // namespace fuzz
}  // namespace trafficrate

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  mkdir(dir.c_str(), 0755);
  if (!trafficrate::fuzz::WriteZoneSeeds(dir) ||
      !trafficrate::fuzz::WriteConfigSeeds(dir) ||
      !trafficrate::fuzz::WriteElfSeeds(dir)) {
    std::fprintf(stderr, "make_fuzz_seeds: could not write the seeds\n");
    return 1;
  }
  return 0;
}
