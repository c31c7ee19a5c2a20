// The zone's segment: the file every process of a server maps (zone_file.h:
// /run/trafficrate/<zone> for root, /dev/shm/trafficrate-UID/<zone> for
// others), made and filled in by its creator, validated by everyone who maps
// it, and marked corrupt once anything in its header no longer holds. It
// hands the zone's parts (zone.h) the validated geometry as ZoneTables: a
// copy private to the process, so that nothing written into the zone
// afterwards (a bug, a stray write, an attack) can move an index out of the
// mapping.
//
//   TRAFFICRATE_ASSIGN_OR_RETURN(std::unique_ptr<ZoneSegment> segment,
//                                ZoneSegment::AttachPath(path));
//   if (!segment->HeaderIntact()) return segment->CorruptStatus("...");
//   const ZoneTables& tables = segment->tables();
//
// Thread and process safety: everything here is safe from any thread; the
// corruption checks and marks are lock-free. Nothing is for the hot path but
// corrupt(), an atomic load.

#ifndef TRAFFICRATE_SRC_SHM_ZONE_SEGMENT_H_
#define TRAFFICRATE_SRC_SHM_ZONE_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/net/key.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {

// How a zone of a given size is divided; a pure function of the size.
struct ZoneGeometry {
  uint32_t bucket_count = 0;
  uint32_t key_capacity = 0;
  uint32_t conn_capacity = 0;
  uint32_t proc_capacity = 0;
  uint32_t handoff_capacity = 0;
  uint64_t buckets_offset = 0;
  uint64_t keys_offset = 0;
  uint64_t conns_offset = 0;
  uint64_t procs_offset = 0;
  uint64_t handoffs_offset = 0;
};

inline constexpr uint64_t kMinZoneSize = 64 * 1024;
inline constexpr uint64_t kMaxZoneSize = 1ULL << 30;

// REQUIRES: kMinZoneSize <= size_bytes <= kMaxZoneSize.
ZoneGeometry ComputeZoneGeometry(uint64_t size_bytes);

// The checksum of a header's immutable part (ZoneHeaderShm::header_checksum).
uint64_t ZoneHeaderChecksum(const ZoneHeaderShm& header);

// A key spec as the zone stores it (ZoneHeaderShm::key_spec,
// RuleSlotShm::key_spec): mode, IPv4 prefix and IPv6 prefix, a byte each.
uint32_t PackKeySpec(const KeySpec& spec);
KeySpec UnpackKeySpec(uint32_t packed);

// Stores n bytes one relaxed atomic at a time: bytes that `trafficrate stat`
// reads without the lock (key bytes, peers, rule names), so that the racing
// read is defined behaviour.
inline void StoreBytesRelaxed(uint8_t* to, const uint8_t* from, size_t n) {
  for (size_t i = 0; i < n; ++i)
    __atomic_store_n(&to[i], from[i], __ATOMIC_RELAXED);
}

// The tables of a validated zone: where each lies in this process's mapping,
// and the capacities read once, when the header was validated, and never
// again. The parts of a zone (KeyTable, ConnTable ...) each keep a copy and
// check every index read from the zone against it; every walk is bounded by
// it.
struct ZoneTables {
  ZoneHeaderShm* header = nullptr;
  uint32_t* buckets = nullptr;
  uint32_t bucket_count = 0;  // a power of two
  KeySlotShm* keys = nullptr;
  uint32_t key_capacity = 0;
  ConnSlotShm* conns = nullptr;
  uint32_t conn_capacity = 0;
  ProcSlotShm* procs = nullptr;
  uint32_t proc_capacity = 0;
  HandoffSlotShm* handoffs = nullptr;
  uint32_t handoff_capacity = 0;
  // The mapping [base, base + size), for HeldMutex.
  const void* base = nullptr;
  size_t size = 0;
};

struct ZonePlaces;

// What ZoneSegment::OpenOrCreate found on its way, for the lines a server
// logs.
struct ZoneOpenNotes {
  // A corrupt zone of that name was replaced by a fresh one.
  bool replaced_corrupt = false;
  // Not empty when the zone's usual place was taken by something not the
  // user's own: the line that says what, and where the zone lives instead
  // (ZonePlaceNotes::Line).
  std::string placement;
  // A file of this user at an earlier version's place for the zone
  // (/dev/shm/trafficrate.NAME): servers still running that version use
  // it, not this zone.
  std::string legacy_path;
};

class ZoneSegment {
 public:
  // Creates the zone of the calling user (geteuid; or of `places`) if it
  // does not exist (size_bytes reserved, live rate set to
  // rate_bytes_per_sec, keys built with key_spec), or attaches to it. An
  // existing zone must have the same layout version, size and key spec, else
  // FailedPreconditionError naming it. Too little room for a new zone is
  // ResourceExhausted (zone_file.h), never a SIGBUS. An existing zone found
  // corrupt (its header checksum does not match, or a process marked it so)
  // is replaced by a fresh one: the processes still using the old one pass
  // through until they restart. An existing zone's live rate is left as it
  // is (Zone::OpenOrCreate sets it).
  static absl::StatusOr<std::unique_ptr<ZoneSegment>> OpenOrCreate(
      absl::string_view zone_name, uint64_t size_bytes,
      uint64_t rate_bytes_per_sec, const KeySpec& key_spec = KeySpec(),
      ZoneOpenNotes* notes = nullptr, const ZonePlaces* places = nullptr);

  // Where the CLI finds zone `zone_name` (a path, starting with '/', is
  // taken as it is): the calling user's own zone; for
  // root, else the one other user's of that name (several: an error naming
  // their paths); else an earlier version's /dev/shm/trafficrate.NAME.
  // NotFoundError, saying where it looked, if there is none.
  static absl::StatusOr<std::string> Locate(absl::string_view zone_name,
                                            const ZonePlaces* places = nullptr);
  // Attaches to an existing zone of any size and key spec (for the CLI):
  // Locate, then AttachPath. NotFoundError if there is none; DataLossError
  // if it is corrupt (IsCorruptZone).
  static absl::StatusOr<std::unique_ptr<ZoneSegment>> Attach(
      absl::string_view zone_name, const ZonePlaces* places = nullptr);
  // Attaches to the zone file at `path` (never through a symlink).
  static absl::StatusOr<std::unique_ptr<ZoneSegment>> AttachPath(
      const std::string& path);

  // Removes the calling user's zone of that name (or of `places`); processes
  // that have it mapped keep using it.
  static absl::Status Unlink(absl::string_view zone_name,
                             const ZonePlaces* places = nullptr);
  static absl::Status UnlinkPath(const std::string& path);

  // Whether an Attach or OpenOrCreate error means the zone is corrupt.
  static bool IsCorruptZone(const absl::Status& status);
  // Whether it means the zone has another layout version (made by another
  // trafficrate version; FailedPreconditionError): never read or replaced,
  // since servers of that version may use it.
  static bool IsOtherLayout(const absl::Status& status);

  // Unmaps the zone.
  ~ZoneSegment();
  ZoneSegment(const ZoneSegment&) = delete;
  ZoneSegment& operator=(const ZoneSegment&) = delete;

  ZoneHeaderShm& header() const { return *tables_.header; }
  const ZoneTables& tables() const { return tables_; }
  const std::string& name() const { return name_; }
  // Where its file was when it was mapped.
  const std::string& path() const { return path_; }

  // Corruption, checked at attach and by every watcher once a second: false
  // once the header's checksum no longer matches (or any process found so
  // and marked the zone). Then the zone is marked corrupt for every process,
  // and this process stops using it: ZoneLock fails at once, and the
  // Governor passes everything through. Lock-free.
  bool CheckHeader();
  // The same look without marking anything (the CLI, snapshots).
  bool HeaderIntact() const;
  // The error a corrupt zone gets (DataLoss), saying what to do about it.
  absl::Status CorruptStatus(absl::string_view why) const;
  // Marks the zone corrupt for every process (see CheckHeader); `why` (a
  // string literal) is what this process found.
  void MarkCorrupt(const char* why);
  // Tests only: forgets the mark, here and in the zone, so that a test can
  // go on feeding garbage to code that would otherwise stop using the zone.
  void ForgetCorruptionForTesting();
  // What this process found, once corrupt().
  const char* corrupt_why() const {
    return corrupt_why_.load(std::memory_order_acquire);
  }
  // This process found (or was told) the zone corrupt.
  bool corrupt() const { return corrupt_.load(std::memory_order_acquire); }

 private:
  // REQUIRES: base holds a validated zone of `size` bytes.
  ZoneSegment(std::string name, std::string path, void* base, size_t size);
  static absl::StatusOr<std::unique_ptr<ZoneSegment>> Map(
      absl::string_view zone_name, const std::string& path, int fd,
      uint64_t size_bytes, bool creator, uint64_t rate_bytes_per_sec,
      uint32_t key_spec);

  std::string name_;
  std::string path_;
  void* base_;
  size_t size_;
  // Filled from the header once it was validated (Map); never reread.
  ZoneTables tables_;
  std::atomic<bool> corrupt_{false};
  std::atomic<const char*> corrupt_why_{nullptr};
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_SEGMENT_H_
