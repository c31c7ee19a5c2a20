// What the libFuzzer targets of tests/fuzz share: a check that aborts (so
// libFuzzer records the input), and the input format of zone_fuzz and
// snapshot_fuzz, which turns one input into a mapped zone.
//
//   ZoneInput in = ParseZoneInput(data, size);
//   std::unique_ptr<Zone> zone = BuildZone(in, FuzzZoneName("zone"));
//   if (zone != nullptr) { ... read and write paths ... }
//   ReleaseClaimedProcs(*zone, claimed);  // before the zone is unmapped
//
// An input is 64 control bytes and a payload:
//   [0]      mode: kRawImage, kTables or kHeaderAndTables (mod 3)
//   [1]      flags (kFlag*)
//   [2..17]  the hash seed of a fresh zone (kTables, kHeaderAndTables)
//   [18..21] the rate, little-endian, plus 1
//   [22]     TRAFFICRATE_KEY of a fresh zone (or asked of an existing one):
//            peer, peer/24,64, local, all (mod 4)
//   [23]     unused
//   [24..63] a script the target interprets (its own ops)
//   [64..]   payload
// kRawImage: the payload is the whole shm object (zero-padded to
//   kFuzzZoneSize, or exactly its length with kFlagExactSize), which the
//   target attaches to (Zone::Attach, or Zone::OpenOrCreate with
//   kFlagOpenOrCreate): this fuzzes the header checks.
// kTables: a fresh, valid zone (Zone::OpenOrCreate) whose tables are then
//   overwritten with the payload: all bucket heads, then the first
//   kWindowKeys key slots, the first kWindowConns connection slots and the
//   first kWindowProcs process slots. So the tables are fuzzed whatever the
//   attach checks (a header checksum included) refuse.
// kHeaderAndTables: as kTables, but the payload starts with a whole header
//   (its lock aside) written over the valid one after attach: a header
//   changed while the zone is in use.
//
// The C library's bytes are not fuzzed: every pthread mutex of the zone (the
// zone lock, each process slot's liveness mutex) is made anew after attach,
// keeping only its lock word from the input: the zone lock is either free
// or left by a dead owner (kFlagOwnerDied: the next ZoneLock repairs), a
// liveness mutex keeps the input's word (only ever try-locked). A zone lock
// word naming a live-looking owner (kFlagLockHeld) makes every ZoneLock time
// out; it is fuzzed only on demand, since each such input waits 15 ms.

#ifndef TRAFFICRATE_TESTS_FUZZ_FUZZ_UTIL_H_
#define TRAFFICRATE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "src/budget/budget.h"
#include "src/net/key.h"
#include "src/shm/zone.h"
#include "src/shm/zone_file.h"
#include "src/shm/zone_layout.h"

// Aborts with the condition, so that libFuzzer saves the input.
#define TRAFFICRATE_FUZZ_CHECK(cond)                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                  \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

namespace trafficrate {
namespace fuzz {

// The zone size the zone targets use, and their -max_len.
inline constexpr uint64_t kFuzzZoneSize = kMinZoneSize;

inline constexpr size_t kControlBytes = 64;
inline constexpr size_t kScriptOffset = 24;
inline constexpr size_t kScriptBytes = kControlBytes - kScriptOffset;

enum class InputMode : uint8_t {
  kRawImage = 0,
  kTables = 1,
  kHeaderAndTables = 2,
};

inline constexpr uint8_t kFlagBudget = 1;        // fresh zone in budget mode
inline constexpr uint8_t kFlagOwnerDied = 2;     // zone lock's owner died
inline constexpr uint8_t kFlagExactSize = 4;     // kRawImage: file size
inline constexpr uint8_t kFlagOpenOrCreate = 8;  // kRawImage: as a server
// The zone lock held by a thread that never lets go (a TID that exists in no
// process, without FUTEX_OWNER_DIED): honoured only with
// TRAFFICRATE_FUZZ_HELD_LOCK=1, since each such input then waits for the
// lock's timeout (tests/shm/zone_test.cc covers the timeout itself).
inline constexpr uint8_t kFlagLockHeld = 16;
// kHeaderAndTables: the header's checksum made to match what was written (a
// forged header); else a header written over fails its check, as a stray
// write would.
inline constexpr uint8_t kFlagForgeChecksum = 32;
inline constexpr int kForeignTid = 0x3ffffff0;

inline bool FuzzHeldLock() {
  static const bool set = std::getenv("TRAFFICRATE_FUZZ_HELD_LOCK") != nullptr;
  return set;
}

inline constexpr uint32_t kWindowKeys = 16;
inline constexpr uint32_t kWindowConns = 16;
inline constexpr uint32_t kWindowProcs = 8;

// zone_fuzz's script: an op byte, then its arguments (zone_fuzz.cc).
enum ZoneOp : uint8_t {
  kFindKey,          // key
  kFindOrInsertKey,  // key
  kRegisterConn,     // key index, proc index, fd, peer's last byte
  kJoin,             // conn index
  kLeave,            // conn index
  kDeregister,       // conn index
  kTransfer,         // conn index, proc index, fd
  kSetUnderPace,     // conn index, under (bit 0)
  kReleaseKey,       // key index
  kClaimProc,        // pid - 1000
  kReapIfDead,       // proc index
  kReapDead,         //
  kRepair,           //
  kSetShare,         // budget (bit 0), burst (bit 1: byte << 12)
  kSetRate,          // (byte << 16) + 1
  kSnapshot,         //
  kReads,            // key, proc index, ms to advance the clock
  kBudgetTick,       // key index, packet bytes / 256, ms to advance
  kHandoff,          // what (publish, take, withdraw, expire, peek), inode
                     // byte, conn index, proc index, cookie byte
  kZoneOpCount,
};
// An index byte: 0xff kNoSlot, 0xfe the capacity (out of range), 0xfd the
// slot last returned by an insert, register or claim, else b % capacity.
inline constexpr uint8_t kLastSlot = 0xfd;
// A key byte: 127.0.0.b (v4-mapped), or with the high bit the key held in
// slot (b & 0x7f).
inline constexpr uint8_t kKeyOfSlot = 0x80;

struct ZoneInput {
  InputMode mode = InputMode::kRawImage;
  uint8_t flags = 0;
  uint64_t hash_seed[2] = {};
  uint64_t rate_bytes_per_sec = 1;
  KeySpec key_spec;
  uint8_t script[kScriptBytes] = {};
  absl::Span<const uint8_t> payload;
};

inline KeySpec KeySpecOf(uint8_t selector) {
  KeySpec spec;
  switch (selector % 4) {
    case 1:
      spec.v4_prefix = 24;
      spec.v6_prefix = 64;
      break;
    case 2:
      spec.mode = KeyMode::kLocal;
      break;
    case 3:
      spec.mode = KeyMode::kAll;
      break;
    default:
      break;
  }
  return spec;
}

// A short input is read as if padded with zeros.
inline ZoneInput ParseZoneInput(const uint8_t* data, size_t size) {
  uint8_t control[kControlBytes] = {};
  if (size > 0) std::memcpy(control, data, std::min(size, kControlBytes));
  ZoneInput in;
  in.mode = static_cast<InputMode>(control[0] % 3);
  in.flags = control[1];
  std::memcpy(in.hash_seed, control + 2, sizeof(in.hash_seed));
  uint32_t rate = 0;
  std::memcpy(&rate, control + 18, sizeof(rate));
  in.rate_bytes_per_sec = uint64_t{rate} + 1;
  in.key_spec = KeySpecOf(control[22]);
  std::memcpy(in.script, control + kScriptOffset, kScriptBytes);
  if (size > kControlBytes) {
    in.payload =
        absl::MakeConstSpan(data + kControlBytes, size - kControlBytes);
  }
  return in;
}

// "fz<pid>_<target>": one zone per fuzzing process.
inline std::string FuzzZoneName(absl::string_view target) {
  return absl::StrCat("fz", getpid(), "_", target);
}

// Where the tables window lies in the zone, and how long it is.
struct WindowPart {
  uint64_t offset;
  uint64_t bytes;
};

inline std::vector<WindowPart> TableWindow() {
  const ZoneGeometry g = ComputeZoneGeometry(kFuzzZoneSize);
  return {
      {g.buckets_offset, uint64_t{4} * g.bucket_count},
      {g.keys_offset, sizeof(KeySlotShm) * uint64_t{kWindowKeys}},
      {g.conns_offset, sizeof(ConnSlotShm) * uint64_t{kWindowConns}},
      {g.procs_offset, sizeof(ProcSlotShm) * uint64_t{kWindowProcs}},
  };
}

inline uint8_t* ZoneBytes(Zone& zone) {
  return reinterpret_cast<uint8_t*>(&zone.header());
}

// memcpy that takes an empty span's null data.
inline void CopyIn(uint8_t* to, const uint8_t* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}

// Copies `bytes` over the window parts in order; returns what it used.
inline size_t WriteWindow(uint8_t* base, absl::Span<const uint8_t> bytes) {
  size_t used = 0;
  for (const WindowPart& part : TableWindow()) {
    const size_t n = std::min<size_t>(part.bytes, bytes.size() - used);
    CopyIn(base + part.offset, bytes.data() + used, n);
    used += n;
  }
  return used;
}

// A mutex's lock word (glibc's __lock: owner TID and futex bits).
inline int& LockWord(pthread_mutex_t& mutex) { return mutex.__data.__lock; }

inline void InitRobust(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
}

// Makes every mutex of the zone anew (see the file comment).
inline void PrepareMutexes(Zone& zone, uint8_t flags) {
  pthread_mutex_t& lock = zone.header().lock;
  InitRobust(&lock);
  if (flags & kFlagOwnerDied) LockWord(lock) = FUTEX_OWNER_DIED;
  if ((flags & kFlagLockHeld) && FuzzHeldLock()) LockWord(lock) = kForeignTid;
  for (uint32_t i = 0; i < zone.procs().capacity(); ++i) {
    pthread_mutex_t& liveness = zone.procs().slot(i).liveness;
    const int word = LockWord(liveness);
    InitRobust(&liveness);
    LockWord(liveness) = word;
  }
}

// Writes `bytes` as the whole zone file of `zone_name`, `file_size` long.
inline bool WriteShmObject(const std::string& zone_name,
                           absl::Span<const uint8_t> bytes, size_t file_size) {
  const std::string path =
      ZoneFilePath(ZonePlaces::ForUser(geteuid()), zone_name);
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const size_t n = std::min(bytes.size(), file_size);
  bool ok = ftruncate(fd, static_cast<off_t>(file_size)) == 0;
  ok = ok && pwrite(fd, bytes.data(), n, 0) == static_cast<ssize_t>(n);
  close(fd);
  return ok;
}

// The error of a refused attach: a status, one line.
inline void CheckAttachError(const absl::Status& status) {
  TRAFFICRATE_FUZZ_CHECK(!status.ok());
  TRAFFICRATE_FUZZ_CHECK(!status.message().empty());
  TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(status.message(), '\n'));
}

inline std::unique_ptr<Zone> AttachRawImage(const ZoneInput& in,
                                            const std::string& name) {
  // The image, with `ready` set: a zone never made ready costs a bounded
  // wait of 2 s per attach (zone_segment_test.cc covers it), which would only
  // slow the fuzzer down.
  const size_t file_size =
      in.flags & kFlagExactSize
          ? std::max(in.payload.size(), sizeof(ZoneHeaderShm))
          : kFuzzZoneSize;
  std::vector<uint8_t> image(in.payload.begin(), in.payload.end());
  image.resize(std::max(image.size(), sizeof(ZoneHeaderShm)));
  const uint32_t one = 1;
  uint32_t ready = 0;
  std::memcpy(&ready, image.data() + offsetof(ZoneHeaderShm, ready), 4);
  if (ready == 0) {
    std::memcpy(image.data() + offsetof(ZoneHeaderShm, ready), &one, 4);
  }
  if (!WriteShmObject(name, image, file_size)) return nullptr;
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      in.flags & kFlagOpenOrCreate
          ? Zone::OpenOrCreate(name, kFuzzZoneSize, in.rate_bytes_per_sec,
                               in.key_spec)
          : Zone::Attach(name);
  (void)ZoneSegment::Unlink(name);
  if (!zone.ok()) {
    CheckAttachError(zone.status());
    // To see why a seed is refused: TRAFFICRATE_FUZZ_DEBUG=1 zone_fuzz SEED
    static const bool debug = std::getenv("TRAFFICRATE_FUZZ_DEBUG") != nullptr;
    if (debug) std::fprintf(stderr, "%s\n", zone.status().ToString().c_str());
    return nullptr;
  }
  return *std::move(zone);
}

inline std::unique_ptr<Zone> OpenAndOverwrite(const ZoneInput& in,
                                              const std::string& name) {
  absl::StatusOr<std::unique_ptr<Zone>> opened = Zone::OpenOrCreate(
      name, kFuzzZoneSize, in.rate_bytes_per_sec, in.key_spec);
  (void)ZoneSegment::Unlink(name);
  if (!opened.ok()) return nullptr;  // /dev/shm full: nothing to fuzz
  std::unique_ptr<Zone> zone = *std::move(opened);
  zone->settings().SetShare(
      in.flags & kFlagBudget ? ShareMode::kBudget : ShareMode::kEqual, 0);
  std::memcpy(zone->header().hash_seed, in.hash_seed, sizeof(in.hash_seed));
  uint8_t* base = ZoneBytes(*zone);
  absl::Span<const uint8_t> rest = in.payload;
  if (in.mode == InputMode::kHeaderAndTables) {
    // All of the header but its lock.
    const size_t n = std::min(rest.size(), sizeof(ZoneHeaderShm));
    const size_t lock_at = offsetof(ZoneHeaderShm, lock);
    const size_t after = lock_at + sizeof(pthread_mutex_t);
    CopyIn(base, rest.data(), std::min(n, lock_at));
    if (n > after) CopyIn(base + after, rest.data() + after, n - after);
    rest = rest.subspan(n);
  }
  // The seed changes the checksum: kept valid, so that the tables are
  // fuzzed past the header check, unless the header is the point.
  if (in.mode != InputMode::kHeaderAndTables ||
      (in.flags & kFlagForgeChecksum)) {
    zone->header().header_checksum = ZoneHeaderChecksum(zone->header());
  }
  WriteWindow(base, rest);
  return zone;
}

// The zone an input describes, mapped, with its name already unlinked; or
// null if it cannot be attached (the error was checked).
inline std::unique_ptr<Zone> BuildZone(const ZoneInput& in,
                                       const std::string& name) {
  (void)ZoneSegment::Unlink(name);  // left by an earlier crash
  std::unique_ptr<Zone> zone = in.mode == InputMode::kRawImage
                                   ? AttachRawImage(in, name)
                                   : OpenAndOverwrite(in, name);
  if (zone != nullptr) PrepareMutexes(*zone, in.flags);
  return zone;
}

// Unlocks the liveness mutexes ProcTable::ClaimLocked left held, so that none
// is on this thread's robust list when the zone is unmapped.
inline void ReleaseClaimedProcs(Zone& zone,
                                const std::vector<uint32_t>& claimed) {
  for (const uint32_t p : claimed) {
    pthread_mutex_unlock(&zone.procs().slot(p).liveness);
  }
}

}  // namespace fuzz
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_FUZZ_FUZZ_UTIL_H_
