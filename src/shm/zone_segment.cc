#include "src/shm/zone_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "src/base/clock.h"
#include "src/base/siphash.h"
#include "src/shm/robust_mutex.h"
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

}  // namespace

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

ZoneSegment::ZoneSegment(std::string name, std::string path, void* base,
                         size_t size)
    : name_(std::move(name)), path_(std::move(path)), base_(base), size_(size) {
  auto* h = static_cast<ZoneHeaderShm*>(base);
  auto* bytes = static_cast<uint8_t*>(base);
  tables_.header = h;
  tables_.buckets = reinterpret_cast<uint32_t*>(bytes + h->buckets_offset);
  tables_.bucket_count = h->bucket_count;
  tables_.keys = reinterpret_cast<KeySlotShm*>(bytes + h->keys_offset);
  tables_.key_capacity = h->key_capacity;
  tables_.conns = reinterpret_cast<ConnSlotShm*>(bytes + h->conns_offset);
  tables_.conn_capacity = h->conn_capacity;
  tables_.procs = reinterpret_cast<ProcSlotShm*>(bytes + h->procs_offset);
  tables_.proc_capacity = h->proc_capacity;
  tables_.handoffs =
      reinterpret_cast<HandoffSlotShm*>(bytes + h->handoffs_offset);
  tables_.handoff_capacity = h->handoff_capacity;
  tables_.base = base;
  tables_.size = size;
}

ZoneSegment::~ZoneSegment() { munmap(base_, size_); }

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

absl::StatusOr<std::unique_ptr<ZoneSegment>> ZoneSegment::Map(
    absl::string_view zone_name, const std::string& path, int fd,
    uint64_t size_bytes, bool creator, uint64_t rate_bytes_per_sec,
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
  return std::unique_ptr<ZoneSegment>(
      new ZoneSegment(std::string(zone_name), path, base, size_bytes));
}

absl::StatusOr<std::unique_ptr<ZoneSegment>> ZoneSegment::OpenOrCreate(
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
  absl::StatusOr<std::unique_ptr<ZoneSegment>> zone =
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

absl::StatusOr<std::string> ZoneSegment::Locate(absl::string_view zone_name,
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

absl::StatusOr<std::unique_ptr<ZoneSegment>> ZoneSegment::AttachPath(
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
  absl::StatusOr<std::unique_ptr<ZoneSegment>> zone =
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

absl::StatusOr<std::unique_ptr<ZoneSegment>> ZoneSegment::Attach(
    absl::string_view zone_name, const ZonePlaces* places) {
  absl::StatusOr<std::string> path = Locate(zone_name, places);
  if (!path.ok()) return path.status();
  return AttachPath(*path);
}

bool ZoneSegment::IsCorruptZone(const absl::Status& status) {
  return absl::IsDataLoss(status);
}

bool ZoneSegment::IsOtherLayout(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         status.GetPayload(kOtherLayoutPayload).has_value();
}

bool ZoneSegment::HeaderIntact() const {
  const ZoneHeaderShm& h = header();
  return !corrupt() && h.corrupt.load(std::memory_order_acquire) == 0 &&
         ZoneHeaderChecksum(h) == h.header_checksum;
}

bool ZoneSegment::CheckHeader() {
  if (HeaderIntact()) return true;
  MarkCorrupt(header().corrupt.load(std::memory_order_acquire) != 0
                  ? "another process found it corrupt"
                  : "its header checksum does not match");
  return false;
}

absl::Status ZoneSegment::CorruptStatus(absl::string_view why) const {
  return CorruptError(path_, name_, why);
}

void ZoneSegment::ForgetCorruptionForTesting() {
  header().corrupt.store(0, std::memory_order_release);
  corrupt_why_.store(nullptr, std::memory_order_release);
  corrupt_.store(false, std::memory_order_release);
}

void ZoneSegment::MarkCorrupt(const char* why) {
  const char* none = nullptr;
  corrupt_why_.compare_exchange_strong(none, why, std::memory_order_acq_rel);
  header().corrupt.store(1, std::memory_order_release);
  corrupt_.store(true, std::memory_order_release);
}

absl::Status ZoneSegment::Unlink(absl::string_view zone_name,
                                 const ZonePlaces* places) {
  const ZonePlaces own =
      places != nullptr ? *places : ZonePlaces::ForUser(geteuid());
  absl::StatusOr<ZoneFile> file = FindZoneFile(own, zone_name);
  if (!file.ok()) return file.status();
  return RemoveZoneFileIfSame(*file);
}

absl::Status ZoneSegment::UnlinkPath(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  }
  return absl::OkStatus();
}

}  // namespace trafficrate
