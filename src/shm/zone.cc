#include "src/shm/zone.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "src/base/clock.h"
#include "src/base/siphash.h"
#include "src/budget/budget.h"
#include "src/budget/share.h"
#include "src/shm/key_budget.h"
#include "src/shm/zone_file.h"

namespace trafficrate {
namespace {

constexpr uint64_t kAlign = 64;
// Marks the error of a zone of another layout version (IsOtherLayout).
constexpr char kOtherLayoutPayload[] = "trafficrate/zone-layout";
constexpr int64_t kAttachWaitNs = 2 * kNsPerSec;
constexpr uint32_t kAnyKeySpec = ~0u;  // Attach: accept the zone's key spec
// The header checksum's SipHash key: fixed, it only detects damage.
constexpr SipKey kHeaderChecksumKey = {0x7472616666696372ULL,
                                       0x6174652068656164ULL};
// OpenOrCreate: how many times a corrupt zone may be replaced (by this or
// another process starting at the same time) before giving up.
constexpr int kReplaceAttempts = 3;

// The error of a zone found corrupt at `path`.
absl::Status CorruptError(const std::string& path, absl::string_view name,
                          absl::string_view why) {
  return absl::DataLossError(absl::StrFormat(
      "zone %s (%s) is corrupt (%s); the processes using it pass through "
      "unpaced; a server started now replaces it, or remove it with "
      "`trafficrate rm --zone %s`",
      name, path, why, name));
}

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) & ~(kAlign - 1); }

uint32_t RoundUpPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 31)) p <<= 1;
  return p;
}

// Fills geometry for n keys and connections; returns the bytes it needs.
uint64_t Layout(uint32_t n, ZoneGeometry* g) {
  g->key_capacity = n;
  g->conn_capacity = n;
  g->proc_capacity = n / 4 > 16 ? n / 4 : 16;
  g->bucket_count = RoundUpPow2(n);
  g->buckets_offset = AlignUp(sizeof(ZoneHeaderShm));
  g->keys_offset = AlignUp(g->buckets_offset + 4ULL * g->bucket_count);
  g->conns_offset = AlignUp(g->keys_offset + sizeof(KeySlotShm) * uint64_t{n});
  g->procs_offset =
      AlignUp(g->conns_offset + sizeof(ConnSlotShm) * uint64_t{n});
  g->handoff_capacity = n / 8 > kMinHandoffSlots ? n / 8 : kMinHandoffSlots;
  g->handoffs_offset = AlignUp(
      g->procs_offset + sizeof(ProcSlotShm) * uint64_t{g->proc_capacity});
  return g->handoffs_offset +
         sizeof(HandoffSlotShm) * uint64_t{g->handoff_capacity};
}

absl::Status InitRobustMutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return absl::ErrnoToStatus(rc, "pthread_mutex_init");
  return absl::OkStatus();
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val,
           const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout,
                 nullptr, 0);
}

uint32_t PackKeySpec(const KeySpec& spec) {
  return static_cast<uint32_t>(spec.mode) |
         static_cast<uint32_t>(spec.v4_prefix & 0xff) << 8 |
         static_cast<uint32_t>(spec.v6_prefix & 0xff) << 16;
}

KeySpec UnpackKeySpec(uint32_t packed) {
  KeySpec spec;
  spec.mode = static_cast<KeyMode>(packed & 0xff);
  spec.v4_prefix = static_cast<int>((packed >> 8) & 0xff);
  spec.v6_prefix = static_cast<int>((packed >> 16) & 0xff);
  return spec;
}

// Bytes that `trafficrate stat` reads without the lock are stored one
// relaxed atomic at a time, so that the racing read is defined behaviour.
void StoreBytes(uint8_t* to, const uint8_t* from, size_t n) {
  for (size_t i = 0; i < n; ++i)
    __atomic_store_n(&to[i], from[i], __ATOMIC_RELAXED);
}

}  // namespace

uint64_t ZoneHeaderChecksum(const ZoneHeaderShm& h) {
  // Copied one relaxed atomic load at a time: nothing writes these bytes
  // once the zone is made, but a stray write may race this very read.
  constexpr size_t kWords = offsetof(ZoneHeaderShm, ready) / sizeof(uint64_t);
  static_assert(kWords * sizeof(uint64_t) == offsetof(ZoneHeaderShm, ready));
  uint64_t words[kWords];
  const auto* from = reinterpret_cast<const uint64_t*>(&h);
  for (size_t i = 0; i < kWords; ++i) {
    words[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
  }
  return SipHash24(kHeaderChecksumKey, words, sizeof(words));
}

ZoneGeometry ComputeZoneGeometry(uint64_t size_bytes) {
  ZoneGeometry g;
  const uint64_t per_unit = sizeof(KeySlotShm) + sizeof(ConnSlotShm) +
                            sizeof(ProcSlotShm) / 4 +
                            sizeof(HandoffSlotShm) / 8 + 8;
  uint64_t n = (size_bytes - AlignUp(sizeof(ZoneHeaderShm))) / per_unit;
  if (n > (1u << 30)) n = 1u << 30;
  while (n > 1 && Layout(static_cast<uint32_t>(n), &g) > size_bytes) --n;
  return g;
}

Zone::Zone(std::string name, std::string path, void* base, size_t size)
    : name_(std::move(name)),
      path_(std::move(path)),
      base_(base),
      size_(size),
      header_(static_cast<ZoneHeaderShm*>(base)),
      key_capacity_(header_->key_capacity),
      conn_capacity_(header_->conn_capacity),
      proc_capacity_(header_->proc_capacity),
      handoff_capacity_(header_->handoff_capacity),
      bucket_count_(header_->bucket_count) {
  auto* bytes = static_cast<uint8_t*>(base);
  buckets_ = reinterpret_cast<uint32_t*>(bytes + header_->buckets_offset);
  keys_ = reinterpret_cast<KeySlotShm*>(bytes + header_->keys_offset);
  conns_ = reinterpret_cast<ConnSlotShm*>(bytes + header_->conns_offset);
  procs_ = reinterpret_cast<ProcSlotShm*>(bytes + header_->procs_offset);
  handoffs_ =
      reinterpret_cast<HandoffSlotShm*>(bytes + header_->handoffs_offset);
}

Zone::~Zone() { munmap(base_, size_); }

namespace {

// Fills a fresh (all-zero) segment and publishes it with a release store.
void InitializeZone(void* base, uint64_t size_bytes,
                    uint64_t rate_bytes_per_sec, uint32_t key_spec) {
  const ZoneGeometry g = ComputeZoneGeometry(size_bytes);
  auto* h = static_cast<ZoneHeaderShm*>(base);
  h->magic = kZoneMagic;
  h->layout_version = kZoneLayoutVersion;
  h->header_size = sizeof(ZoneHeaderShm);
  h->zone_size = size_bytes;
  h->key_slot_size = sizeof(KeySlotShm);
  h->conn_slot_size = sizeof(ConnSlotShm);
  h->proc_slot_size = sizeof(ProcSlotShm);
  h->bucket_count = g.bucket_count;
  h->key_capacity = g.key_capacity;
  h->conn_capacity = g.conn_capacity;
  h->proc_capacity = g.proc_capacity;
  h->key_spec = key_spec;
  h->buckets_offset = g.buckets_offset;
  h->keys_offset = g.keys_offset;
  h->conns_offset = g.conns_offset;
  h->procs_offset = g.procs_offset;
  h->handoffs_offset = g.handoffs_offset;
  h->handoff_capacity = g.handoff_capacity;
  if (getrandom(h->hash_seed, sizeof(h->hash_seed), 0) !=
      static_cast<ssize_t>(sizeof(h->hash_seed))) {
    // getrandom cannot fail for 16 bytes once the pool is ready; fall back to
    // time and address bits rather than refusing to run.
    h->hash_seed[0] = static_cast<uint64_t>(MonotonicNowNs()) ^ getpid();
    h->hash_seed[1] = reinterpret_cast<uintptr_t>(base) * 0x9e3779b97f4a7c15ULL;
  }
  h->header_checksum = ZoneHeaderChecksum(*h);
  h->rate_bytes_per_sec.store(rate_bytes_per_sec, std::memory_order_relaxed);
  (void)InitRobustMutex(&h->lock);
  auto* bytes = static_cast<uint8_t*>(base);
  auto* buckets = reinterpret_cast<uint32_t*>(bytes + g.buckets_offset);
  auto* keys = reinterpret_cast<KeySlotShm*>(bytes + g.keys_offset);
  auto* conns = reinterpret_cast<ConnSlotShm*>(bytes + g.conns_offset);
  auto* procs = reinterpret_cast<ProcSlotShm*>(bytes + g.procs_offset);
  for (uint32_t i = 0; i < g.bucket_count; ++i) buckets[i] = kNoSlot;
  for (uint32_t i = 0; i < g.key_capacity; ++i) {
    keys[i].next = i + 1 < g.key_capacity ? i + 1 : kNoSlot;
  }
  for (uint32_t i = 0; i < g.conn_capacity; ++i) {
    conns[i].next_free = i + 1 < g.conn_capacity ? i + 1 : kNoSlot;
    conns[i].key_index.store(kNoSlot, std::memory_order_relaxed);
    conns[i].proc_index.store(kNoSlot, std::memory_order_relaxed);
  }
  for (uint32_t i = 0; i < g.proc_capacity; ++i) {
    (void)InitRobustMutex(&procs[i].liveness);
  }
  h->key_free_head = 0;
  h->conn_free_head = 0;
  h->ready.store(1, std::memory_order_release);
}

// Checks everything the Zone view trusts: a layout this library reads, a
// header whose checksum holds, and a geometry that matches both the stored
// size and the segment's real size. A zone of another layout version is
// refused (FailedPrecondition: a running server of that version may use it);
// anything else that does not hold is corruption (DataLoss).
absl::Status ValidateHeader(const ZoneHeaderShm& h, const std::string& path,
                            absl::string_view name, uint64_t actual_size) {
  if (h.magic == kZoneMagic && h.layout_version != kZoneLayoutVersion) {
    absl::Status status = absl::FailedPreconditionError(absl::StrFormat(
        "zone %s (%s) has layout version %u, this library uses %u (another "
        "trafficrate version); stop the servers using it, then remove it "
        "with `trafficrate rm --force --zone %s`",
        name, path, h.layout_version, kZoneLayoutVersion,
        absl::StrContains(path, "/trafficrate.") ? path : std::string(name)));
    status.SetPayload(kOtherLayoutPayload,
                      absl::Cord(absl::StrCat(h.layout_version)));
    return status;
  }
  if (h.magic != kZoneMagic) return CorruptError(path, name, "bad magic");
  if (h.corrupt.load(std::memory_order_acquire) != 0) {
    return CorruptError(path, name, "marked corrupt by a process that used it");
  }
  if (ZoneHeaderChecksum(h) != h.header_checksum) {
    return CorruptError(path, name, "header checksum mismatch");
  }
  const bool size_ok = h.zone_size >= kMinZoneSize &&
                       h.zone_size <= kMaxZoneSize &&
                       h.zone_size == actual_size;
  const ZoneGeometry g =
      size_ok ? ComputeZoneGeometry(h.zone_size) : ZoneGeometry{};
  if (!size_ok || h.layout_version != kZoneLayoutVersion ||
      h.header_size != sizeof(ZoneHeaderShm) ||
      h.key_slot_size != sizeof(KeySlotShm) ||
      h.conn_slot_size != sizeof(ConnSlotShm) ||
      h.proc_slot_size != sizeof(ProcSlotShm) ||
      g.key_capacity != h.key_capacity || g.conn_capacity != h.conn_capacity ||
      g.proc_capacity != h.proc_capacity || g.bucket_count != h.bucket_count ||
      g.buckets_offset != h.buckets_offset || g.keys_offset != h.keys_offset ||
      g.conns_offset != h.conns_offset || g.procs_offset != h.procs_offset ||
      g.handoff_capacity != h.handoff_capacity ||
      g.handoffs_offset != h.handoffs_offset) {
    return CorruptError(path, name, "inconsistent geometry");
  }
  return absl::OkStatus();
}

// The zone's name from its path: the file's name, without the "trafficrate."
// of an earlier version's /dev/shm object.
std::string NameOfPath(absl::string_view path) {
  absl::string_view name = path.substr(path.rfind('/') + 1);
  absl::ConsumePrefix(&name, "trafficrate.");
  return std::string(name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Zone>> Zone::Map(absl::string_view zone_name,
                                                const std::string& path, int fd,
                                                uint64_t size_bytes,
                                                bool creator,
                                                uint64_t rate_bytes_per_sec,
                                                uint32_t key_spec) {
  if (size_bytes < kMinZoneSize || size_bytes > kMaxZoneSize) {
    // Too small to hold a header (an empty file), or too large to be one.
    return CorruptError(path, zone_name,
                        absl::StrCat("its size is ", size_bytes, " bytes"));
  }
  void* base =
      mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap ", path));
  }
  if (creator) InitializeZone(base, size_bytes, rate_bytes_per_sec, key_spec);
  auto* header = static_cast<ZoneHeaderShm*>(base);
  const int64_t deadline = MonotonicNowNs() + kAttachWaitNs;
  while (header->ready.load(std::memory_order_acquire) == 0 &&
         MonotonicNowNs() < deadline) {
    SleepNs(kNsPerMs);
  }
  absl::Status valid =
      header->ready.load(std::memory_order_acquire) == 0
          ? CorruptError(path, zone_name,
                         "never initialized: its creator died?")
          : ValidateHeader(*header, path, zone_name, size_bytes);
  if (valid.ok() && key_spec != kAnyKeySpec && header->key_spec != key_spec) {
    valid = absl::FailedPreconditionError(absl::StrFormat(
        "zone %s (%s) groups clients by TRAFFICRATE_KEY=%s, not %s; use "
        "another TRAFFICRATE_ZONE for another key",
        zone_name, path, DescribeKeySpec(UnpackKeySpec(header->key_spec)),
        DescribeKeySpec(UnpackKeySpec(key_spec))));
  }
  if (!valid.ok()) {
    munmap(base, size_bytes);
    return valid;
  }
  return std::unique_ptr<Zone>(
      new Zone(std::string(zone_name), path, base, size_bytes));
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::OpenOrCreate(
    absl::string_view zone_name, uint64_t size_bytes,
    uint64_t rate_bytes_per_sec, const KeySpec& key_spec, ZoneOpenNotes* notes,
    const ZonePlaces* places) {
  if (size_bytes < kMinZoneSize || size_bytes > kMaxZoneSize) {
    return absl::InvalidArgumentError(
        absl::StrFormat("zone size %u is outside %u..%u", size_bytes,
                        kMinZoneSize, kMaxZoneSize));
  }
  const ZonePlaces own =
      places != nullptr ? *places : ZonePlaces::ForUser(geteuid());
  ZoneOpenNotes local;
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      absl::InternalError("unreachable");
  // Bounded: each turn either ends, or finds a corrupt zone it replaces, or
  // lost the race to publish a new one to another process starting now.
  for (int attempt = 0; attempt < 2 * kReplaceAttempts; ++attempt) {
    ZonePlaceNotes placed;
    absl::StatusOr<ZoneFile> file = FindZoneFile(own, zone_name, &placed);
    const bool creator = absl::IsNotFound(file.status());
    if (creator) file = MakeZoneFile(own, zone_name, size_bytes, &placed);
    if (!file.ok()) return file.status();
    local.placement = placed.Line(zone_name);
    const int64_t size = file->Size();
    if (!creator && size != static_cast<int64_t>(size_bytes) &&
        size >= static_cast<int64_t>(kMinZoneSize)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "zone %s (%s) has size %d but TRAFFICRATE_ZONE_SIZE asks for %u; "
          "use the same size, another TRAFFICRATE_ZONE, or remove it with "
          "`trafficrate rm --zone %s` once no server uses it",
          zone_name, file->path(), size, size_bytes, zone_name));
    }
    zone = Map(zone_name, file->path(), file->fd(),
               creator ? size_bytes
                       : static_cast<uint64_t>(std::max<int64_t>(size, 0)),
               creator, rate_bytes_per_sec, PackKeySpec(key_spec));
    if (creator && zone.ok()) {
      const absl::Status published = PublishZoneFile(*file);
      if (absl::IsAlreadyExists(published)) {
        // Another process published first: attach theirs (ours, never
        // seen by anyone, goes with this mapping).
        zone = absl::UnavailableError(absl::StrFormat(
            "zone %s: other processes kept making it at the same time",
            zone_name));
        continue;
      }
      if (!published.ok()) return published;
    }
    if (creator || !IsCorruptZone(zone.status())) break;
    // Corrupt: take its name away (only if it is still the file we opened,
    // not one another starting server just made) and start afresh.
    // Whoever still has it mapped passes through until restarted.
    (void)RemoveZoneFileIfSame(*file);
    local.replaced_corrupt = true;
  }
  if (zone.ok() &&
      (*zone)->header().rate_bytes_per_sec.load() != rate_bytes_per_sec) {
    (*zone)->SetRate(rate_bytes_per_sec);
  }
  if (zone.ok()) {
    struct stat st {};
    const std::string legacy = LegacyZonePath(own, zone_name);
    if (lstat(legacy.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == own.uid) {
      local.legacy_path = legacy;
    }
  }
  if (notes != nullptr) *notes = std::move(local);
  return zone;
}

absl::StatusOr<std::string> Zone::Locate(absl::string_view zone_name,
                                         const ZonePlaces* places) {
  if (absl::StartsWith(zone_name, "/")) return std::string(zone_name);
  const ZonePlaces own =
      places != nullptr ? *places : ZonePlaces::ForUser(geteuid());
  absl::StatusOr<ZoneFile> file = FindZoneFile(own, zone_name);
  if (file.ok()) return file->path();
  if (!absl::IsNotFound(file.status())) return file.status();
  const std::vector<std::string> found = FindZoneFilesOfAnyUser(own, zone_name);
  if (found.size() == 1) return found[0];
  if (found.size() > 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "zone %s exists for several users (%s); name one with --zone PATH",
        zone_name, absl::StrJoin(found, ", ")));
  }
  const std::string legacy = LegacyZonePath(own, zone_name);
  struct stat st {};
  if (lstat(legacy.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return legacy;
  std::string where = absl::StrJoin(own.dirs, ", ");
  if (own.uid != 0) {
    absl::StrAppend(&where,
                    "; a server running as root keeps its zones where "
                    "only root can read them: run this as root");
  }
  return absl::NotFoundError(absl::StrFormat(
      "no zone %s (no server with TRAFFICRATE_ZONE=%s has started as user %s; "
      "looked in %s)",
      zone_name, zone_name, DescribeUser(own.uid), where));
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::AttachPath(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      return absl::NotFoundError(absl::StrCat("no zone ", path));
    if (err == EACCES) {
      struct stat st {};
      const uid_t owner = stat(path.c_str(), &st) == 0 ? st.st_uid : 0;
      return absl::PermissionDeniedError(absl::StrFormat(
          "zone %s is owned by user %s: run this as that user or as root", path,
          DescribeUser(owner)));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("open ", path));
  }
  struct stat st {};
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      fstat(fd, &st) != 0
          ? absl::ErrnoToStatus(errno, absl::StrCat("fstat ", path))
      : !S_ISREG(st.st_mode)
          ? absl::FailedPreconditionError(
                absl::StrCat(path, " is not a zone: not a regular file"))
          : Map(NameOfPath(path), path, fd, static_cast<uint64_t>(st.st_size),
                /*creator=*/false, 0, kAnyKeySpec);
  close(fd);
  return zone;
}

absl::StatusOr<std::unique_ptr<Zone>> Zone::Attach(absl::string_view zone_name,
                                                   const ZonePlaces* places) {
  absl::StatusOr<std::string> path = Locate(zone_name, places);
  if (!path.ok()) return path.status();
  return AttachPath(*path);
}

bool Zone::IsCorruptZone(const absl::Status& status) {
  return absl::IsDataLoss(status);
}

bool Zone::IsOtherLayout(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         status.GetPayload(kOtherLayoutPayload).has_value();
}

bool Zone::HeaderIntact() const {
  return !corrupt() && header_->corrupt.load(std::memory_order_acquire) == 0 &&
         ZoneHeaderChecksum(*header_) == header_->header_checksum;
}

bool Zone::CheckHeader() {
  if (HeaderIntact()) return true;
  MarkCorrupt(header_->corrupt.load(std::memory_order_acquire) != 0
                  ? "another process found it corrupt"
                  : "its header checksum does not match");
  return false;
}

absl::Status Zone::CorruptStatus(absl::string_view why) const {
  return CorruptError(path_, name_, why);
}

void Zone::ForgetCorruptionForTesting() {
  header_->corrupt.store(0, std::memory_order_release);
  corrupt_why_.store(nullptr, std::memory_order_release);
  corrupt_.store(false, std::memory_order_release);
}

void Zone::MarkCorrupt(const char* why) {
  const char* none = nullptr;
  corrupt_why_.compare_exchange_strong(none, why, std::memory_order_acq_rel);
  header_->corrupt.store(1, std::memory_order_release);
  corrupt_.store(true, std::memory_order_release);
}

int32_t Zone::LockHolder() const {
  return __atomic_load_n(&header_->lock.__data.__lock, __ATOMIC_RELAXED) &
         FUTEX_TID_MASK;
}

bool Zone::RecheckLock() {
  if (!lock_stalled()) return true;
  ZoneLock lock(*this, kLockRecheckWaitNs, ZoneLock::Mode::kRecheck);
  return lock.ok();
}

absl::Status Zone::Unlink(absl::string_view zone_name,
                          const ZonePlaces* places) {
  const ZonePlaces own =
      places != nullptr ? *places : ZonePlaces::ForUser(geteuid());
  absl::StatusOr<ZoneFile> file = FindZoneFile(own, zone_name);
  if (!file.ok()) return file.status();
  return RemoveZoneFileIfSame(*file);
}

absl::Status Zone::UnlinkPath(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  }
  return absl::OkStatus();
}

KeySpec Zone::key_spec() const { return UnpackKeySpec(header_->key_spec); }

uint32_t Zone::BucketOf(const uint8_t* key_bytes) const {
  const SipKey seed{header_->hash_seed[0], header_->hash_seed[1]};
  return static_cast<uint32_t>(SipHash24(seed, key_bytes, kKeyBytes)) &
         (bucket_count_ - 1);
}

uint32_t Zone::FindKeyLocked(const uint8_t* key_bytes) const {
  uint32_t i = buckets_[BucketOf(key_bytes)];
  for (uint32_t steps = 0; i < key_capacity() && steps < key_capacity();
       ++steps) {
    if (std::memcmp(keys_[i].key, key_bytes, kKeyBytes) == 0) return i;
    i = keys_[i].next;
  }
  return kNoSlot;
}

uint32_t Zone::FindOrInsertKeyLocked(const uint8_t* key_bytes, int64_t now_ns) {
  const uint32_t found = FindKeyLocked(key_bytes);
  if (found != kNoSlot) return found;
  const uint32_t i = header_->key_free_head;
  if (i >= key_capacity()) {
    header_->table_full.fetch_add(1, std::memory_order_relaxed);
    return kNoSlot;
  }
  KeySlotShm& k = keys_[i];
  header_->key_free_head = k.next;
  StoreBytes(k.key, key_bytes, kKeyBytes);
  k.refs.store(0, std::memory_order_relaxed);
  k.active.store(0, std::memory_order_relaxed);
  k.bytes_closed.store(0, std::memory_order_relaxed);
  k.last_active_ns.store(now_ns, std::memory_order_relaxed);
  k.connections_served.store(0, std::memory_order_relaxed);
  k.sent_bytes.store(0, std::memory_order_relaxed);
  k.lease.store(0, std::memory_order_relaxed);
  ClearUnderPace(k);
  k.start_pending.store(0, std::memory_order_relaxed);
  StoreBudget(k, BudgetState());
  const uint32_t bucket = BucketOf(key_bytes);
  k.next = buckets_[bucket];
  k.in_use.store(1, std::memory_order_release);
  buckets_[bucket] = i;
  ++header_->keys_used;
  return i;
}

uint32_t Zone::RegisterConnLocked(uint32_t key_index, uint32_t proc_index,
                                  int fd, const uint8_t peer[16],
                                  uint16_t peer_port) {
  const uint32_t i = header_->conn_free_head;
  if (i >= conn_capacity() || key_index >= key_capacity() ||
      proc_index >= proc_capacity()) {
    header_->table_full.fetch_add(1, std::memory_order_relaxed);
    return kNoSlot;
  }
  ConnSlotShm& c = conns_[i];
  header_->conn_free_head = c.next_free;
  c.next_free = kNoSlot;
  c.key_index.store(key_index, std::memory_order_relaxed);
  c.proc_index.store(proc_index, std::memory_order_relaxed);
  c.fd.store(fd, std::memory_order_relaxed);
  c.active.store(0, std::memory_order_relaxed);
  c.share_bytes_per_sec.store(0, std::memory_order_relaxed);
  c.bytes_sent.store(0, std::memory_order_relaxed);
  c.bytes_left.store(0, std::memory_order_relaxed);
  c.drain_bytes.store(0, std::memory_order_relaxed);
  c.under_pace.store(0, std::memory_order_relaxed);
  StoreBytes(c.peer, peer, sizeof(c.peer));
  __atomic_store_n(&c.peer_port, peer_port, __ATOMIC_RELAXED);
  // Odd: in use. The release store publishes the fields above.
  c.seq.store(c.seq.load(std::memory_order_relaxed) | 1u,
              std::memory_order_release);
  keys_[key_index].refs.fetch_add(1, std::memory_order_relaxed);
  keys_[key_index].connections_served.fetch_add(1, std::memory_order_relaxed);
  procs_[proc_index].conns.fetch_add(1, std::memory_order_relaxed);
  ++header_->conns_used;
  return i;
}

uint32_t Zone::FindConnLocked(uint32_t key_index, const uint8_t peer[16],
                              uint16_t peer_port) const {
  if (key_index >= key_capacity()) return kNoSlot;
  uint32_t left = keys_[key_index].refs.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < conn_capacity() && left > 0; ++i) {
    const ConnSlotShm& c = conns_[i];
    if ((c.seq.load(std::memory_order_relaxed) & 1) == 0 ||
        c.key_index.load(std::memory_order_relaxed) != key_index) {
      continue;
    }
    --left;
    if (__atomic_load_n(&c.peer_port, __ATOMIC_RELAXED) == peer_port &&
        std::memcmp(c.peer, peer, sizeof(c.peer)) == 0) {
      return i;
    }
  }
  return kNoSlot;
}

void Zone::ReleaseKeyIfUnusedLocked(uint32_t key_index) {
  if (key_index >= key_capacity()) return;
  KeySlotShm& k = keys_[key_index];
  if (!k.in_use.load(std::memory_order_relaxed) ||
      k.refs.load(std::memory_order_relaxed) != 0) {
    return;
  }
  UnlinkKeyLocked(key_index);
  FreeKeyLocked(key_index);
}

void Zone::UnlinkKeyLocked(uint32_t key_index) {
  uint32_t* link = &buckets_[BucketOf(keys_[key_index].key)];
  for (uint32_t steps = 0; *link < key_capacity() && steps < key_capacity();
       ++steps) {
    if (*link == key_index) {
      *link = keys_[key_index].next;
      return;
    }
    link = &keys_[*link].next;
  }
}

void Zone::FreeKeyLocked(uint32_t key_index) {
  KeySlotShm& k = keys_[key_index];
  k.in_use.store(0, std::memory_order_release);
  k.refs.store(0, std::memory_order_relaxed);
  k.active.store(0, std::memory_order_relaxed);
  ClearUnderPace(k);
  k.generation.fetch_add(1, std::memory_order_release);
  static constexpr uint8_t kZeros[kKeyBytes] = {};
  StoreBytes(k.key, kZeros, kKeyBytes);
  k.next = header_->key_free_head;
  header_->key_free_head = key_index;
  if (header_->keys_used > 0) --header_->keys_used;
}

bool Zone::JoinLocked(uint32_t conn_index) {
  if (conn_index >= conn_capacity()) return false;
  ConnSlotShm& c = conns_[conn_index];
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  if ((c.seq.load(std::memory_order_relaxed) & 1) == 0 || k >= key_capacity() ||
      c.active.load(std::memory_order_relaxed)) {
    return false;
  }
  c.active.store(1, std::memory_order_relaxed);
  if (c.bytes_sent.load(std::memory_order_relaxed) == 0 &&
      share_mode() == ShareMode::kBudget) {
    // New: its first segments leave unpaced (BudgetInput).
    keys_[k].start_pending.fetch_add(kUnpacedStartBytes,
                                     std::memory_order_relaxed);
  }
  const uint32_t before =
      keys_[k].active.fetch_add(1, std::memory_order_relaxed);
  AdjustLevelLocked(keys_[k], before, before + 1);
  keys_[k].last_active_ns.store(MonotonicNowNs(), std::memory_order_relaxed);
  keys_[k].generation.fetch_add(1, std::memory_order_release);
  return true;
}

void Zone::DropUnderPace(ConnSlotShm& conn) {
  if (conn.under_pace.exchange(0, std::memory_order_relaxed) == 0) return;
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k < key_capacity()) trafficrate::DropUnderPace(keys_[k]);
}

void Zone::SetUnderPace(uint32_t conn_index, bool under) {
  if (conn_index >= conn_capacity()) return;
  ConnSlotShm& c = conns_[conn_index];
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  if (k >= key_capacity()) return;
  if (!under) {
    DropUnderPace(c);
    return;
  }
  if (!c.active.load(std::memory_order_relaxed) ||
      c.under_pace.load(std::memory_order_relaxed) != 0 ||
      !AddUnderPace(keys_[k])) {
    return;
  }
  c.under_pace.store(1, std::memory_order_relaxed);
}

bool Zone::LeaveLocked(uint32_t conn_index) {
  if (conn_index >= conn_capacity()) return false;
  ConnSlotShm& c = conns_[conn_index];
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  if ((c.seq.load(std::memory_order_relaxed) & 1) == 0 || k >= key_capacity()) {
    return false;
  }
  DropUnderPace(c);
  if (!c.active.load(std::memory_order_relaxed)) return false;
  c.active.store(0, std::memory_order_relaxed);
  const uint32_t before = keys_[k].active.load(std::memory_order_relaxed);
  if (before > 0) {
    keys_[k].active.fetch_sub(1, std::memory_order_relaxed);
    AdjustLevelLocked(keys_[k], before, before - 1);
  }
  keys_[k].last_active_ns.store(MonotonicNowNs(), std::memory_order_relaxed);
  keys_[k].generation.fetch_add(1, std::memory_order_release);
  return true;
}

bool Zone::DeregisterConnLocked(uint32_t conn_index) {
  if (conn_index >= conn_capacity()) return false;
  ConnSlotShm& c = conns_[conn_index];
  if ((c.seq.load(std::memory_order_relaxed) & 1) == 0) return false;
  const bool changed = LeaveLocked(conn_index);
  const uint32_t k = c.key_index.load(std::memory_order_relaxed);
  const uint32_t p = c.proc_index.load(std::memory_order_relaxed);
  if (k < key_capacity()) {
    keys_[k].bytes_closed.fetch_add(
        c.bytes_sent.load(std::memory_order_relaxed),
        std::memory_order_relaxed);
    if (keys_[k].refs.load(std::memory_order_relaxed) > 0) {
      keys_[k].refs.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (p < proc_capacity() &&
      procs_[p].conns.load(std::memory_order_relaxed) > 0) {
    procs_[p].conns.fetch_sub(1, std::memory_order_relaxed);
  }
  // Even: free. Any fd entry holding the old cookie now sees it is stale.
  c.seq.fetch_add(1, std::memory_order_release);
  c.key_index.store(kNoSlot, std::memory_order_relaxed);
  c.proc_index.store(kNoSlot, std::memory_order_relaxed);
  c.active.store(0, std::memory_order_relaxed);
  c.next_free = header_->conn_free_head;
  header_->conn_free_head = conn_index;
  if (header_->conns_used > 0) --header_->conns_used;
  ReleaseKeyIfUnusedLocked(k);
  return changed;
}

void Zone::TransferConnLocked(uint32_t conn_index, uint32_t proc_index,
                              int fd) {
  if (conn_index >= conn_capacity() || proc_index >= proc_capacity()) return;
  ConnSlotShm& c = conns_[conn_index];
  const uint32_t old = c.proc_index.load(std::memory_order_relaxed);
  if (old == proc_index) return;
  if (old < proc_capacity() &&
      procs_[old].conns.load(std::memory_order_relaxed) > 0) {
    procs_[old].conns.fetch_sub(1, std::memory_order_relaxed);
  }
  procs_[proc_index].conns.fetch_add(1, std::memory_order_relaxed);
  c.proc_index.store(proc_index, std::memory_order_relaxed);
  c.fd.store(fd, std::memory_order_relaxed);
}

namespace {

// A handoff this old (or dated this far ahead) is free for another: its
// sender's watcher expires its own after 2 s.
constexpr int64_t kHandoffStaleNs = 10 * kNsPerSec;

}  // namespace

void Zone::ClearHandoffLocked(uint32_t index) {
  HandoffSlotShm& slot = handoffs_[index];
  const uint32_t conn = slot.conn.load(std::memory_order_relaxed);
  if (conn < conn_capacity() &&
      conns_[conn].handoff.load(std::memory_order_relaxed) == index + 1) {
    conns_[conn].handoff.store(0, std::memory_order_relaxed);
  }
  if (slot.inode.load(std::memory_order_relaxed) != 0) {
    const uint32_t pending =
        header_->handoffs_pending.load(std::memory_order_relaxed);
    header_->handoffs_pending.store(pending > 0 ? pending - 1 : 0,
                                    std::memory_order_relaxed);
  }
  slot.inode.store(0, std::memory_order_relaxed);
  slot.conn.store(kNoSlot, std::memory_order_relaxed);
  slot.cookie.store(0, std::memory_order_relaxed);
  slot.proc.store(kNoSlot, std::memory_order_relaxed);
  slot.since_ns.store(0, std::memory_order_relaxed);
}

bool Zone::PublishHandoffLocked(uint64_t inode, uint32_t conn, uint32_t cookie,
                                uint32_t proc, int64_t now_ns) {
  if (inode == 0 || conn >= conn_capacity()) return false;
  uint32_t free_slot = kNoSlot;
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    HandoffSlotShm& slot = handoffs_[i];
    const uint64_t held = slot.inode.load(std::memory_order_relaxed);
    if (held == inode) {  // passed again (to another process, or onward)
      free_slot = i;
      break;
    }
    // Free, or beyond any use: no process of the zone would ever clear it
    // (its sender expires its own after kHandoffStaleNs at most; anything
    // else was written by something other than this library).
    const int64_t since = slot.since_ns.load(std::memory_order_relaxed);
    const bool stale =
        held == 0 ||
        slot.proc.load(std::memory_order_relaxed) >= proc_capacity() ||
        slot.conn.load(std::memory_order_relaxed) >= conn_capacity() ||
        since > now_ns + kHandoffStaleNs || since < now_ns - kHandoffStaleNs;
    if (stale && free_slot == kNoSlot) free_slot = i;
  }
  if (free_slot == kNoSlot) return false;
  ClearHandoffLocked(free_slot);
  HandoffSlotShm& slot = handoffs_[free_slot];
  slot.conn.store(conn, std::memory_order_relaxed);
  slot.cookie.store(cookie, std::memory_order_relaxed);
  slot.proc.store(proc, std::memory_order_relaxed);
  slot.since_ns.store(now_ns, std::memory_order_relaxed);
  // A connection passed on before it was received keeps only its newest
  // handoff.
  const uint32_t before = conns_[conn].handoff.load(std::memory_order_relaxed);
  if (before != 0 && before - 1 < handoff_capacity() &&
      before - 1 != free_slot &&
      handoffs_[before - 1].conn.load(std::memory_order_relaxed) == conn) {
    ClearHandoffLocked(before - 1);
  }
  conns_[conn].handoff.store(free_slot + 1, std::memory_order_relaxed);
  header_->handoffs_pending.fetch_add(1, std::memory_order_relaxed);
  slot.inode.store(inode, std::memory_order_release);
  return true;
}

uint32_t Zone::TakeHandoffLocked(uint64_t inode, uint32_t* cookie) {
  if (inode == 0) return kNoSlot;
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    HandoffSlotShm& slot = handoffs_[i];
    if (slot.inode.load(std::memory_order_relaxed) != inode) continue;
    const uint32_t conn = slot.conn.load(std::memory_order_relaxed);
    const uint32_t passed = slot.cookie.load(std::memory_order_relaxed);
    ClearHandoffLocked(i);
    if (conn >= conn_capacity()) return kNoSlot;
    const uint32_t seq = conns_[conn].seq.load(std::memory_order_relaxed);
    // Ended meanwhile (reaped, or expired by its sender): nothing to take.
    if ((seq & 1) == 0 || CookieOf(seq) != passed) return kNoSlot;
    *cookie = passed;
    return conn;
  }
  return kNoSlot;
}

void Zone::WithdrawHandoffLocked(uint64_t inode, uint32_t proc) {
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    const HandoffSlotShm& slot = handoffs_[i];
    if (inode != 0 && slot.inode.load(std::memory_order_relaxed) == inode &&
        slot.proc.load(std::memory_order_relaxed) == proc) {
      ClearHandoffLocked(i);
    }
  }
}

bool Zone::HandoffPendingLocked(uint32_t conn, uint32_t cookie) const {
  return MayBeHandedOff(conn, cookie);
}

uint32_t Zone::ExpireHandoffsLocked(uint32_t proc, int64_t before_ns,
                                    uint64_t* out, uint32_t max) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < handoff_capacity() && n < max; ++i) {
    const HandoffSlotShm& slot = handoffs_[i];
    if (slot.inode.load(std::memory_order_relaxed) == 0 ||
        slot.proc.load(std::memory_order_relaxed) != proc ||
        slot.since_ns.load(std::memory_order_relaxed) >= before_ns) {
      continue;
    }
    out[n++] = uint64_t{slot.conn.load(std::memory_order_relaxed)} << 32 |
               slot.cookie.load(std::memory_order_relaxed);
    ClearHandoffLocked(i);
  }
  return n;
}

bool Zone::AnyHandoffs() const {
  return header_->handoffs_pending.load(std::memory_order_acquire) != 0;
}

bool Zone::MayHaveHandoff(uint64_t inode) const {
  if (inode == 0 || !AnyHandoffs()) return false;
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    if (handoffs_[i].inode.load(std::memory_order_acquire) == inode) {
      return true;
    }
  }
  return false;
}

bool Zone::HasOldHandoffs(uint32_t proc, int64_t before_ns) const {
  if (!AnyHandoffs()) return false;
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    const HandoffSlotShm& slot = handoffs_[i];
    if (slot.inode.load(std::memory_order_relaxed) != 0 &&
        slot.proc.load(std::memory_order_relaxed) == proc &&
        slot.since_ns.load(std::memory_order_relaxed) < before_ns) {
      return true;
    }
  }
  return false;
}

bool Zone::MayBeHandedOff(uint32_t conn, uint32_t cookie) const {
  if (conn >= conn_capacity()) return false;
  const uint32_t h = conns_[conn].handoff.load(std::memory_order_relaxed);
  if (h == 0 || h - 1 >= handoff_capacity()) return false;
  const HandoffSlotShm& slot = handoffs_[h - 1];
  return slot.inode.load(std::memory_order_relaxed) != 0 &&
         slot.conn.load(std::memory_order_relaxed) == conn &&
         slot.cookie.load(std::memory_order_relaxed) == cookie;
}

uint32_t Zone::ClaimProcLocked(int32_t pid, int64_t now_ns, HeldMutex* liveness,
                               uint32_t* conns_reaped) {
  uint32_t reaped = 0;
  const uint32_t high_water =
      std::min(header_->procs_high_water.load(std::memory_order_relaxed),
               proc_capacity());
  for (uint32_t i = 0; i < high_water; ++i) {
    const ProcSlotShm& p = procs_[i];
    uint32_t conns = 0;
    // The kernel marks a robust mutex owner-died when its owner exits or
    // execs (a slot whose owner let it go on purpose is left alone here).
    const int word =
        __atomic_load_n(&p.liveness.__data.__lock, __ATOMIC_ACQUIRE);
    if (p.state.load(std::memory_order_relaxed) == kProcLive &&
        p.pid.load(std::memory_order_relaxed) == pid &&
        (word & FUTEX_OWNER_DIED) != 0 && ReapIfDeadLocked(i, &conns)) {
      reaped += conns;
    }
  }
  uint32_t slot = ClaimFreeProcLocked(pid, now_ns, liveness);
  for (uint32_t i = 0; slot == kNoSlot && i < proc_capacity(); ++i) {
    uint32_t conns = 0;
    if (procs_[i].state.load(std::memory_order_relaxed) == kProcLive &&
        ProcMaybeDead(procs_[i]) && ReapIfDeadLocked(i, &conns)) {
      reaped += conns;
      slot = ClaimFreeProcLocked(pid, now_ns, liveness);
    }
  }
  if (conns_reaped != nullptr) *conns_reaped = reaped;
  if (slot == kNoSlot) {
    header_->table_full.fetch_add(1, std::memory_order_relaxed);
  }
  return slot;
}

uint32_t Zone::ClaimFreeProcLocked(int32_t pid, int64_t now_ns,
                                   HeldMutex* liveness) {
  for (uint32_t i = 0; i < proc_capacity(); ++i) {
    ProcSlotShm& p = procs_[i];
    if (p.state.load(std::memory_order_relaxed) != kProcFree) continue;
    int rc = pthread_mutex_trylock(&p.liveness);
    if (rc == EOWNERDEAD) {
      // A reaper died between freeing the slot and unlocking it.
      pthread_mutex_consistent(&p.liveness);
      rc = 0;
    }
    if (rc != 0) continue;
    if (liveness != nullptr) liveness->Hold(&p.liveness, base_, size_);
    p.pid.store(pid, std::memory_order_relaxed);
    p.conns.store(0, std::memory_order_relaxed);
    p.watcher_cpu.store(0, std::memory_order_relaxed);
    p.watcher_stretch.store(0, std::memory_order_relaxed);
    p.watcher_due_ms.store(0, std::memory_order_relaxed);
    p.started_ns = now_ns;
    p.uid.store(static_cast<uint32_t>(geteuid()), std::memory_order_relaxed);
    p.rules_seen.store(0, std::memory_order_relaxed);
    p.rules_status.store(kReloadNone, std::memory_order_relaxed);
    p.rules_errno.store(0, std::memory_order_relaxed);
    p.shaped_calls.store(0, std::memory_order_relaxed);
    p.shaper_syscalls.store(0, std::memory_order_relaxed);
    p.shaped_pieces.store(0, std::memory_order_relaxed);
    p.state.store(kProcLive, std::memory_order_release);
    if (header_->procs_high_water.load(std::memory_order_relaxed) <= i) {
      header_->procs_high_water.store(i + 1, std::memory_order_release);
    }
    return i;
  }
  return kNoSlot;
}

int64_t Zone::LatestWatcherLateNs(int64_t now_ns, int64_t max_late_ns) const {
  const uint32_t high_water =
      std::min(header_->procs_high_water.load(std::memory_order_relaxed),
               proc_capacity());
  const uint32_t now_ms = static_cast<uint32_t>(now_ns / kNsPerMs);
  int64_t latest = 0;
  for (uint32_t i = 0; i < high_water; ++i) {
    const ProcSlotShm& p = procs_[i];
    const uint32_t due_ms = p.watcher_due_ms.load(std::memory_order_relaxed);
    if (due_ms == 0 || p.state.load(std::memory_order_relaxed) != kProcLive ||
        p.conns.load(std::memory_order_relaxed) == 0) {
      continue;
    }
    // Milliseconds wrap every 49 days; their difference does not.
    const int64_t late_ns =
        int64_t{static_cast<int32_t>(now_ms - due_ms)} * kNsPerMs;
    if (late_ns > latest && late_ns <= max_late_ns) latest = late_ns;
  }
  return latest;
}

bool Zone::ReapIfDeadLocked(uint32_t proc_index, uint32_t* conns_reaped) {
  if (proc_index >= proc_capacity()) return false;
  ProcSlotShm& p = procs_[proc_index];
  if (p.state.load(std::memory_order_relaxed) != kProcLive) return false;
  const int rc = pthread_mutex_trylock(&p.liveness);
  if (rc == EBUSY) return false;  // its watcher holds it: alive
  if (rc == 0) {
    // Held by nobody while marked live: the owner unlocked it on purpose
    // (never done) or a claim was torn. Treat as dead.
  } else if (rc != EOWNERDEAD) {
    return false;
  }
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&p.liveness);
  HeldMutex held;
  held.Hold(&p.liveness, base_, size_);
  uint32_t reaped = 0;
  for (uint32_t i = 0; i < conn_capacity(); ++i) {
    ConnSlotShm& c = conns_[i];
    if ((c.seq.load(std::memory_order_relaxed) & 1) &&
        c.proc_index.load(std::memory_order_relaxed) == proc_index) {
      DeregisterConnLocked(i);
      ++reaped;
    }
  }
  // Its sockets passed and not yet received: their connections are gone.
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    if (handoffs_[i].proc.load(std::memory_order_relaxed) == proc_index) {
      ClearHandoffLocked(i);
    }
  }
  p.pid.store(0, std::memory_order_relaxed);
  p.conns.store(0, std::memory_order_relaxed);
  p.state.store(kProcFree, std::memory_order_release);
  if (!held.Release()) MarkCorrupt("a process slot's mutex changed while held");
  header_->procs_reaped.fetch_add(1, std::memory_order_relaxed);
  header_->conns_reaped.fetch_add(reaped, std::memory_order_relaxed);
  if (conns_reaped != nullptr) *conns_reaped = reaped;
  return true;
}

uint32_t Zone::ReapDead(uint32_t* procs) {
  uint32_t conns = 0;
  uint32_t reaped_procs = 0;
  // Only the slots ever claimed, but all of them now and then: a process of
  // an older version claims slots without raising the high water.
  uint32_t limit = proc_capacity();
  const uint32_t high_water =
      header_->procs_high_water.load(std::memory_order_acquire);
  if (high_water != 0 && high_water < limit &&
      reap_passes_.fetch_add(1, std::memory_order_relaxed) % kFullReapEvery !=
          0) {
    limit = high_water;
  }
  for (uint32_t p = 0; p < limit; ++p) {
    if (procs_[p].state.load(std::memory_order_acquire) != kProcLive ||
        !ProcMaybeDead(procs_[p])) {
      continue;
    }
    uint32_t reaped = 0;
    ZoneLock lock(*this);
    if (!lock.ok()) break;
    if (ReapIfDeadLocked(p, &reaped)) {
      ++reaped_procs;
      conns += reaped;
    }
  }
  if (reaped_procs > 0) WakeWatchers();
  if (procs != nullptr) *procs = reaped_procs;
  return conns;
}

bool Zone::ProcMaybeDead(const ProcSlotShm& proc) {
  // glibc keeps the owner's TID in the low bits of __lock and sets
  // FUTEX_OWNER_DIED when the kernel releases a dead owner's robust mutex.
  const int word =
      __atomic_load_n(&proc.liveness.__data.__lock, __ATOMIC_ACQUIRE);
  return (word & FUTEX_OWNER_DIED) != 0 || (word & FUTEX_TID_MASK) == 0;
}

void Zone::RepairLocked() {
  // Keys: recount refs and active from the connections, which are written
  // before they are published; drop half-built connections.
  for (uint32_t i = 0; i < key_capacity(); ++i) {
    keys_[i].refs.store(0, std::memory_order_relaxed);
    keys_[i].active.store(0, std::memory_order_relaxed);
    ClearUnderPace(keys_[i]);
  }
  for (uint32_t i = 0; i < proc_capacity(); ++i) {
    procs_[i].conns.store(0, std::memory_order_relaxed);
  }
  header_->conn_free_head = kNoSlot;
  header_->conns_used = 0;
  for (uint32_t n = conn_capacity(); n-- > 0;) {
    ConnSlotShm& c = conns_[n];
    const uint32_t k = c.key_index.load(std::memory_order_relaxed);
    const uint32_t p = c.proc_index.load(std::memory_order_relaxed);
    const bool in_use = c.seq.load(std::memory_order_relaxed) & 1;
    if (in_use && k < key_capacity() && keys_[k].in_use.load() &&
        p < proc_capacity()) {
      keys_[k].refs.fetch_add(1, std::memory_order_relaxed);
      if (c.active.load(std::memory_order_relaxed)) {
        keys_[k].active.fetch_add(1, std::memory_order_relaxed);
        if (c.under_pace.load(std::memory_order_relaxed) &&
            !AddUnderPace(keys_[k])) {
          c.under_pace.store(0, std::memory_order_relaxed);
        }
      } else {
        c.under_pace.store(0, std::memory_order_relaxed);
      }
      procs_[p].conns.fetch_add(1, std::memory_order_relaxed);
      ++header_->conns_used;
      continue;
    }
    if (in_use) c.seq.fetch_add(1, std::memory_order_release);
    c.active.store(0, std::memory_order_relaxed);
    c.under_pace.store(0, std::memory_order_relaxed);
    c.key_index.store(kNoSlot, std::memory_order_relaxed);
    c.proc_index.store(kNoSlot, std::memory_order_relaxed);
    c.next_free = header_->conn_free_head;
    header_->conn_free_head = n;
  }
  // Chains and the key free list, rebuilt from the keys still referenced.
  for (uint32_t b = 0; b < bucket_count_; ++b) buckets_[b] = kNoSlot;
  header_->key_free_head = kNoSlot;
  header_->keys_used = 0;
  for (uint32_t n = key_capacity(); n-- > 0;) {
    KeySlotShm& k = keys_[n];
    k.generation.fetch_add(1, std::memory_order_release);
    if (k.in_use.load() && k.refs.load() > 0) {
      const uint32_t bucket = BucketOf(k.key);
      k.next = buckets_[bucket];
      buckets_[bucket] = n;
      ++header_->keys_used;
      continue;
    }
    k.in_use.store(0);
    k.refs.store(0);
    k.next = header_->key_free_head;
    header_->key_free_head = n;
  }
  uint32_t pending = 0;
  for (uint32_t i = 0; i < handoff_capacity(); ++i) {
    pending += handoffs_[i].inode.load(std::memory_order_relaxed) != 0;
  }
  header_->handoffs_pending.store(pending, std::memory_order_relaxed);
  header_->lock_repairs.fetch_add(1, std::memory_order_relaxed);
}

BudgetSettings Zone::budget_settings(uint32_t rule) const {
  // Within what TRAFFICRATE_RATE and TRAFFICRATE_BURST accept: whatever the
  // zone holds, the controller's arithmetic stays defined.
  return BudgetSettings{
      std::clamp<uint64_t>(RuleRate(rule), 1, kMaxRateBytesPerSec),
      std::min<uint64_t>(RuleBurst(rule), kMaxBurstBytes)};
}

uint64_t Zone::KeyRate(const KeySlotShm& key) const {
  const uint64_t rate = RuleRate(RuleOf(key));
  const uint64_t share = key.cluster_share.load(std::memory_order_relaxed);
  if (share == 0 || share >= rate) return rate;
  const int64_t beat = header_->cluster.beat_ns.load(std::memory_order_relaxed);
  const int64_t now = MonotonicNowNs();
  if (beat == 0 || now - beat > kClusterStaleNs ||
      beat - now > kClusterStaleNs) {
    return rate;
  }
  return share;
}

BudgetSettings Zone::key_budget_settings(const KeySlotShm& key) const {
  const uint32_t rule = RuleOf(key);
  BudgetSettings settings = budget_settings(rule);
  const uint64_t rate = KeyRate(key);
  if (rate == settings.rate_bytes_per_sec || rate == 0) return settings;
  const uint64_t burst =
      rule == 0 ? header_->burst_bytes.load(std::memory_order_relaxed)
      : rule < kZoneRules
          ? header_->rules[rule].burst_bytes.load(std::memory_order_relaxed)
          : 0;
  settings.rate_bytes_per_sec = std::min(rate, kMaxRateBytesPerSec);
  if (burst == 0) settings.burst_bytes = DefaultBurstBytes(rate);
  return settings;
}

uint32_t Zone::RuleOfKeyBytes(const uint8_t* key_bytes) {
  return __atomic_load_n(&key_bytes[kKeyRuleByte], __ATOMIC_RELAXED);
}

uint32_t Zone::RuleOf(const KeySlotShm& key) const {
  return RuleOfKeyBytes(key.key);
}

uint64_t Zone::RuleRate(uint32_t rule) const {
  if (rule == 0) {
    return header_->rate_bytes_per_sec.load(std::memory_order_relaxed);
  }
  if (rule >= kZoneRules) return 0;
  return header_->rules[rule].rate_bytes_per_sec.load(
      std::memory_order_relaxed);
}

uint64_t Zone::RuleBurst(uint32_t rule) const {
  const uint64_t burst =
      rule == 0 ? header_->burst_bytes.load(std::memory_order_relaxed)
      : rule < kZoneRules
          ? header_->rules[rule].burst_bytes.load(std::memory_order_relaxed)
          : 0;
  return burst != 0 ? burst : DefaultBurstBytes(RuleRate(rule));
}

KeySpec Zone::RuleKeySpec(uint32_t rule) const {
  if (rule == 0 || rule >= kZoneRules) return key_spec();
  return UnpackKeySpec(
      header_->rules[rule].key_spec.load(std::memory_order_relaxed));
}

std::string Zone::RuleName(uint32_t rule) const {
  std::string name;
  if (rule < kZoneRules) {
    for (size_t i = 0; i + 1 < kRuleNameBytes; ++i) {
      const char c = static_cast<char>(
          __atomic_load_n(&header_->rules[rule].name[i], __ATOMIC_RELAXED));
      if (c == 0) break;
      // What a rules file allows in a name; anything else is a stray write.
      const bool ok = absl::ascii_isalnum(static_cast<uint8_t>(c)) ||
                      c == '_' || c == '.' || c == '-';
      name.push_back(ok ? c : '?');
    }
  }
  if (!name.empty()) return name;
  return rule == 0 ? "default" : absl::StrCat("rule ", rule);
}

uint32_t Zone::FindRule(absl::string_view name) const {
  for (uint32_t rule = 0; rule < kZoneRules; ++rule) {
    if (rule > 0 && RuleRate(rule) == 0) continue;
    if (RuleName(rule) == name) return rule;
  }
  return kNoSlot;
}

void Zone::SetRule(uint32_t rule, absl::string_view name,
                   uint64_t rate_bytes_per_sec, uint64_t burst_bytes,
                   const KeySpec& key_spec) {
  if (rule >= kZoneRules) return;
  RuleSlotShm& slot = header_->rules[rule];
  uint8_t bytes[kRuleNameBytes] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), kRuleNameBytes - 1));
  StoreBytes(slot.name, bytes, sizeof(bytes));
  if (rule != 0) {
    slot.key_spec.store(PackKeySpec(key_spec), std::memory_order_relaxed);
    slot.burst_bytes.store(burst_bytes, std::memory_order_relaxed);
    slot.rate_bytes_per_sec.store(rate_bytes_per_sec,
                                  std::memory_order_relaxed);
  }
  header_->settings_generation.fetch_add(1, std::memory_order_release);
  WakeWatchers();
}

uint32_t Zone::MapRuleLocked(absl::string_view name, const KeySpec& key_spec) {
  const auto named = [&](uint32_t rule) {
    const uint8_t* bytes = header_->rules[rule].name;
    if (name.empty() || name.size() >= kRuleNameBytes) return false;
    for (size_t i = 0; i < kRuleNameBytes; ++i) {
      const uint8_t c = __atomic_load_n(&bytes[i], __ATOMIC_RELAXED);
      if (i == name.size()) return c == 0;
      if (c != static_cast<uint8_t>(name[i])) return false;
    }
    return false;
  };
  const uint32_t packed = PackKeySpec(key_spec);
  const uint8_t none[kRuleNameBytes] = {};
  for (uint32_t rule = 0; rule < kZoneRules; ++rule) {
    if (!named(rule)) continue;
    const uint32_t spec =
        rule == 0
            ? header_->key_spec
            : header_->rules[rule].key_spec.load(std::memory_order_relaxed);
    if (spec == packed) return rule;
    StoreBytes(header_->rules[rule].name, none, sizeof(none));
  }
  for (uint32_t rule = 1; rule < kZoneRules; ++rule) {
    RuleSlotShm& slot = header_->rules[rule];
    if (slot.rate_bytes_per_sec.load(std::memory_order_relaxed) != 0 ||
        __atomic_load_n(&slot.name[0], __ATOMIC_RELAXED) != 0) {
      continue;
    }
    uint8_t bytes[kRuleNameBytes] = {};
    std::memcpy(bytes, name.data(), std::min(name.size(), kRuleNameBytes - 1));
    StoreBytes(slot.name, bytes, sizeof(bytes));
    slot.key_spec.store(packed, std::memory_order_relaxed);
    return rule;
  }
  return kNoSlot;
}

void Zone::SetRuleRate(uint32_t rule, uint64_t rate_bytes_per_sec) {
  if (rule == 0) return SetRate(rate_bytes_per_sec);
  if (rule >= kZoneRules) return;
  header_->rules[rule].rate_bytes_per_sec.store(rate_bytes_per_sec,
                                                std::memory_order_relaxed);
  header_->settings_generation.fetch_add(1, std::memory_order_release);
  WakeWatchers();
}

void Zone::AdjustLevelLocked(KeySlotShm& key, uint32_t before, uint32_t after) {
  if (share_mode() != ShareMode::kBudget) return;
  const BudgetState next = BudgetMembershipChange(
      LoadBudget(key), key_budget_settings(key), before, after);
  key.boost.store(next.boost, std::memory_order_relaxed);
  key.level_bytes_per_sec.store(next.level_bytes_per_sec,
                                std::memory_order_relaxed);
}

void Zone::SetShare(ShareMode mode, uint64_t burst_bytes) {
  const uint32_t m = static_cast<uint32_t>(mode);
  if (header_->share_mode.load(std::memory_order_relaxed) == m &&
      header_->burst_bytes.load(std::memory_order_relaxed) == burst_bytes) {
    return;
  }
  header_->share_mode.store(m, std::memory_order_relaxed);
  header_->burst_bytes.store(burst_bytes, std::memory_order_relaxed);
  header_->settings_generation.fetch_add(1, std::memory_order_release);
  WakeWatchers();
}

ShareMode Zone::share_mode() const {
  return header_->share_mode.load(std::memory_order_relaxed) ==
                 static_cast<uint32_t>(ShareMode::kBudget)
             ? ShareMode::kBudget
             : ShareMode::kEqual;
}

void Zone::SetRate(uint64_t rate_bytes_per_sec) {
  header_->rate_bytes_per_sec.store(rate_bytes_per_sec,
                                    std::memory_order_relaxed);
  header_->settings_generation.fetch_add(1, std::memory_order_release);
  WakeWatchers();
}

uint32_t Zone::ChangeWord() const {
  return header_->change_word.load(std::memory_order_acquire);
}

void Zone::WakeWatchers() {
  header_->change_word.fetch_add(1, std::memory_order_seq_cst);
  if (header_->watchers_waiting.load(std::memory_order_seq_cst) == 0) return;
  Futex(&header_->change_word, FUTEX_WAKE, INT_MAX, nullptr);
}

void Zone::WaitForChange(uint32_t seen, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  header_->watchers_waiting.fetch_add(1, std::memory_order_seq_cst);
  const timespec ts{static_cast<time_t>(timeout_ns / kNsPerSec),
                    static_cast<long>(timeout_ns % kNsPerSec)};
  if (header_->change_word.load(std::memory_order_seq_cst) == seen) {
    Futex(&header_->change_word, FUTEX_WAIT, seen, &ts);
  }
  header_->watchers_waiting.fetch_sub(1, std::memory_order_seq_cst);
}

namespace {

// This thread's robust list head (set_robust_list), where glibc's links end.
thread_local uintptr_t t_robust_head = 0;

uintptr_t RobustHead() {
  if (t_robust_head == 0) {
    void* head = nullptr;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) == 0) {
      t_robust_head = reinterpret_cast<uintptr_t>(head);
    }
  }
  return t_robust_head;
}

// The calling thread's robust list head, found by locking a private robust
// mutex: glibc links it at the front of the thread's list, which is a ring
// through the mutexes the thread holds back to the head, and the head lies
// in the thread's descriptor (at pthread_self(), within a page). 0 if not
// found.
uintptr_t FindRobustHead() {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_t m;
  pthread_mutex_init(&m, &attr);
  pthread_mutexattr_destroy(&attr);
  uintptr_t head = 0;
  if (pthread_mutex_lock(&m) == 0) {
    const uintptr_t self = reinterpret_cast<uintptr_t>(pthread_self());
    void* link = m.__data.__list.__next;
    for (int i = 0; i < 64 && link != nullptr; ++i) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(link) & ~uintptr_t{1};
      if (p >= self && p < self + 4096) {
        head = p;
        break;
      }
      link = reinterpret_cast<__pthread_list_t*>(p)->__next;
    }
    pthread_mutex_unlock(&m);
  }
  pthread_mutex_destroy(&m);
  return head;
}

}  // namespace

void ReregisterRobustList() {
  void* head = nullptr;
  size_t len = 0;
  if (syscall(SYS_get_robust_list, 0, &head, &len) == 0 && head != nullptr) {
    return;
  }
  const uintptr_t found = FindRobustHead();
  // struct robust_list_head: the list, the futex offset, the pending op.
  if (found != 0 &&
      syscall(SYS_set_robust_list, found, 3 * sizeof(void*)) == 0) {
    t_robust_head = found;
  }
}

namespace {

// Locks waiting at most wait_ns, measured on CLOCK_MONOTONIC, so that a
// change of the wall clock cannot lengthen the wait.
int TimedLock(pthread_mutex_t* mutex, int64_t wait_ns) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer (GCC 12) knows neither pthread_mutex_clocklock nor
  // EOWNERDEAD from pthread_mutex_timedlock; it knows both from trylock.
  const int64_t deadline = MonotonicNowNs() + wait_ns;
  for (;;) {
    const int rc = pthread_mutex_trylock(mutex);
    if (rc != EBUSY || MonotonicNowNs() >= deadline) {
      return rc == EBUSY ? ETIMEDOUT : rc;
    }
    SleepNs(20'000);
  }
#else
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const int64_t ns = deadline.tv_nsec + wait_ns;
  deadline.tv_sec += static_cast<time_t>(ns / kNsPerSec);
  deadline.tv_nsec = static_cast<long>(ns % kNsPerSec);
  return pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &deadline);
#endif
}

}  // namespace

void HeldMutex::Hold(pthread_mutex_t* m, const void* base, size_t size) {
  mutex = m;
  kind = __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED);
  tid = __atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK;
  lo = reinterpret_cast<uintptr_t>(base);
  hi = lo + size;
}

bool HeldMutex::Release() {
  if (mutex == nullptr) return true;
  pthread_mutex_t* m = mutex;
  mutex = nullptr;
  // glibc's unlink writes 16 bytes around each link: [p - 8, p + 8).
  const uintptr_t head = RobustHead();
  const auto sane = [&](const void* link) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(link) & ~uintptr_t{1};
    return (head != 0 && p == head) || (p >= lo + 8 && p + 8 <= hi);
  };
  const bool intact =
      __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) == kind &&
      (__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK) ==
          tid &&
      sane(__atomic_load_n(&m->__data.__list.__next, __ATOMIC_RELAXED)) &&
      sane(__atomic_load_n(&m->__data.__list.__prev, __ATOMIC_RELAXED));
  if (!intact) return false;
  pthread_mutex_unlock(m);
  return true;
}

ZoneLock::ZoneLock(Zone& zone, int64_t wait_ns)
    : ZoneLock(zone, wait_ns, Mode::kNormal) {}

ZoneLock::ZoneLock(Zone& zone, int64_t wait_ns, Mode mode) : zone_(zone) {
  if (zone_.corrupt()) return;
  pthread_mutex_t* mutex = &zone_.header().lock;
  int rc;
  if ((mode == Mode::kNormal && zone_.lock_stalled()) || wait_ns <= 0) {
    rc = pthread_mutex_trylock(mutex);
  } else {
    rc = TimedLock(mutex, wait_ns);
  }
  if (rc == EOWNERDEAD) {
    // The last holder died inside a critical section: rebuild everything that
    // could be half-written before anyone else sees it.
    zone_.RepairLocked();
    pthread_mutex_consistent(mutex);
    repaired_ = true;
    rc = 0;
  }
  if (rc == ETIMEDOUT || rc == EBUSY) {
    // Held too long, or still held after an earlier timeout: the caller
    // passes through.
    zone_.lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
    zone_.header().lock_timeouts.fetch_add(1, std::memory_order_relaxed);
    if (rc == ETIMEDOUT) {
      zone_.lock_stalled_.store(true, std::memory_order_relaxed);
    }
    return;
  }
  if (rc != 0) {
    // A lock no call can take (EINVAL, EDEADLK, EAGAIN, ENOTRECOVERABLE):
    // a write into the zone broke it, or a repair died half-way.
    zone_.MarkCorrupt("its lock is broken");
    return;
  }
  if (zone_.lock_stalled()) {
    zone_.lock_stalled_.store(false, std::memory_order_relaxed);
  }
  held_.Hold(mutex, zone_.base(), zone_.size());
  locked_ = true;
}

ZoneLock::~ZoneLock() {
  // A lock changed under its holder: something writes into the zone.
  if (locked_ && !held_.Release()) {
    zone_.MarkCorrupt("its lock changed while this process held it");
  }
  // Every generation moved: let all watchers re-apply, outside the lock.
  if (repaired_) zone_.WakeWatchers();
}

}  // namespace trafficrate
