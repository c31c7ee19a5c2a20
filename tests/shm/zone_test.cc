// The shm zone within one process: creating, attaching and validating a
// zone (refused headers are never written), the hash seed, and the key and
// connection tables (insert, join/leave, cookies, full tables). The tests
// across processes (counts from forked children, repair after a lock holder
// died, process liveness and reaping, futex wakes) are in
// zone_recovery_test.cc; the fixture is in test_util.h.

#include "src/shm/zone.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/shm/key_budget.h"
#include "src/shm/zone_file.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using testing_util::kOneMiB;
using testing_util::kPeer;
using testing_util::kRate;
using testing_util::MakeKey;

// Where the calling user's zone of that name is (or would be).
std::string ZonePathOf(const std::string& zone_name) {
  return ZoneFilePath(ZonePlaces::ForUser(geteuid()), zone_name);
}

// Copies the whole zone file, to show that a refused zone was not written.
std::vector<uint8_t> ReadShm(const std::string& zone_name) {
  const int fd = open(ZonePathOf(zone_name).c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  if (fd < 0) return {};
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  EXPECT_EQ(pread(fd, bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(bytes.size()));
  close(fd);
  return bytes;
}

// Maps the header of an existing shm object for tampering.
class RawHeader {
 public:
  explicit RawHeader(const std::string& zone_name) {
    const int fd = open(ZonePathOf(zone_name).c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    if (fd < 0) return;
    void* p = mmap(nullptr, sizeof(ZoneHeaderShm), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(p, MAP_FAILED);
    if (p != MAP_FAILED) header_ = static_cast<ZoneHeaderShm*>(p);
  }
  ~RawHeader() {
    if (header_ != nullptr) munmap(header_, sizeof(ZoneHeaderShm));
  }
  ZoneHeaderShm* get() const { return header_; }

 private:
  ZoneHeaderShm* header_ = nullptr;
};

class ZoneTest : public testing_util::ZoneFixture {
 protected:
  // Creates a zone, closes it, then lets `tamper` change its header in the
  // shm object. Returns the object's bytes after tampering.
  template <typename Tamper>
  std::vector<uint8_t> CreateAndTamper(Tamper tamper) {
    {
      std::unique_ptr<Zone> zone = Open();
      if (zone == nullptr) return {};
    }
    RawHeader raw(zone_name_);
    if (raw.get() == nullptr) return {};
    tamper(*raw.get());
    return ReadShm(zone_name_);
  }
};

TEST_F(ZoneTest, CreatedZoneHasAValidHeaderAndEmptyTables) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const ZoneHeaderShm& h = zone->header();
  const ZoneGeometry g = ComputeZoneGeometry(kOneMiB);
  EXPECT_EQ(h.magic, kZoneMagic);
  EXPECT_EQ(h.layout_version, kZoneLayoutVersion);
  EXPECT_EQ(h.zone_size, kOneMiB);
  EXPECT_EQ(h.ready.load(), 1u);
  EXPECT_EQ(h.rate_bytes_per_sec.load(), kRate);
  EXPECT_EQ(zone->keys().capacity(), g.key_capacity);
  EXPECT_EQ(zone->conns().capacity(), g.conn_capacity);
  EXPECT_EQ(zone->procs().capacity(), g.proc_capacity);
  EXPECT_EQ(zone->name(), zone_name_);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  EXPECT_EQ(h.keys_used, 0u);
  EXPECT_EQ(h.conns_used, 0u);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), kNoSlot);
}

TEST_F(ZoneTest, SecondOpenerAttachesAndSeesTheFirstsData) {
  std::unique_ptr<Zone> first = Open();
  ASSERT_NE(first, nullptr);
  uint32_t conn = kNoSlot;
  {
    ZoneLock lock(*first);
    ASSERT_TRUE(lock.ok());
    conn = RegisterLocked(*first, 42, 3);
    ASSERT_NE(conn, kNoSlot);
    EXPECT_TRUE(first->conns().JoinLocked(conn));
  }
  std::unique_ptr<Zone> second = Open();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->header().hash_seed[0], first->header().hash_seed[0]);
  EXPECT_EQ(second->header().hash_seed[1], first->header().hash_seed[1]);
  {
    ZoneLock lock(*second);
    ASSERT_TRUE(lock.ok());
    const uint32_t k = second->keys().FindLocked(MakeKey(42).bytes);
    ASSERT_NE(k, kNoSlot);
    EXPECT_EQ(second->keys().slot(k).refs.load(), 1u);
    EXPECT_EQ(second->keys().slot(k).active.load(), 1u);
    EXPECT_EQ(second->conns().slot(conn).key_index.load(), k);
    EXPECT_EQ(second->conns().slot(conn).proc_index.load(), 3u);
    EXPECT_EQ(second->header().conns_used, 1u);
    // A change through the second mapping shows in the first.
    EXPECT_TRUE(second->conns().DeregisterLocked(conn));
  }
  ZoneLock lock(*first);
  EXPECT_EQ(first->header().conns_used, 0u);
  EXPECT_EQ(first->header().keys_used, 0u);
  EXPECT_EQ(first->keys().FindLocked(MakeKey(42).bytes), kNoSlot);
}

// The crash of issue 8: three header fields set to large values in a live
// zone. Each process keeps the geometry it validated at attach, so the
// stray values move no index out of the mapping (the sanitizer builds
// would see it) and the tables go on working.
TEST_F(ZoneTest, GeometryOverwrittenInALiveZoneIsNotUsed) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t keys = zone->keys().capacity();
  const uint32_t conns = zone->conns().capacity();
  const uint32_t procs = zone->procs().capacity();
  ZoneHeaderShm& h = zone->header();
  const uint32_t buckets = h.bucket_count;
  h.key_capacity = 0xfffffff0u;
  h.conn_capacity = 0xfffffff0u;
  h.proc_capacity = 0xfffffff0u;
  h.bucket_count = 0x80000000u;
  h.keys_offset = ~0ull;
  h.conns_offset = ~0ull;
  EXPECT_EQ(zone->keys().capacity(), keys);
  EXPECT_EQ(zone->conns().capacity(), conns);
  EXPECT_EQ(zone->procs().capacity(), procs);
  std::set<uint32_t> seen;
  for (uint32_t n = 0; n < 64; ++n) {
    const uint32_t bucket = zone->keys().BucketOf(MakeKey(n).bytes);
    seen.insert(bucket);
    EXPECT_LT(bucket, buckets);
  }
  EXPECT_GT(seen.size(), 1u);  // still a hash, not a constant
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t conn = RegisterLocked(*zone, 7, 0);
  ASSERT_NE(conn, kNoSlot);
  EXPECT_LT(conn, conns);
  EXPECT_TRUE(zone->conns().JoinLocked(conn));
  const uint32_t k = zone->keys().FindLocked(MakeKey(7).bytes);
  ASSERT_LT(k, keys);
  EXPECT_EQ(zone->keys().slot(k).active.load(), 1u);
  EXPECT_TRUE(zone->conns().DeregisterLocked(conn));
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(7).bytes), kNoSlot);
  // Out-of-range indices written into the tables are refused, not followed.
  h.conn_free_head = 0xfffffff0u;
  h.key_free_head = 0xfffffff0u;
  EXPECT_EQ(RegisterLocked(*zone, 8, 0), kNoSlot);
}

TEST_F(ZoneTest, AttachSeesAnExistingZoneOfAnySize) {
  std::unique_ptr<Zone> created = Open(2 * kOneMiB);
  ASSERT_NE(created, nullptr);
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->header().zone_size, 2 * kOneMiB);
  EXPECT_EQ((*attached)->keys().capacity(), created->keys().capacity());
  // Attach is for the CLI: it does not touch the live rate.
  EXPECT_EQ((*attached)->header().rate_bytes_per_sec.load(), kRate);
}

TEST_F(ZoneTest, LastOpenerWithAnotherRateSetsTheLiveRate) {
  std::unique_ptr<Zone> first = Open(kOneMiB, kRate);
  ASSERT_NE(first, nullptr);
  const uint32_t settings = first->header().settings_generation.load();
  std::unique_ptr<Zone> same = Open(kOneMiB, kRate);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(first->header().settings_generation.load(), settings);
  std::unique_ptr<Zone> second = Open(kOneMiB, 3 * kRate);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->header().rate_bytes_per_sec.load(), 3 * kRate);
  EXPECT_NE(first->header().settings_generation.load(), settings);
}

TEST_F(ZoneTest, OpenWithAnotherSizeIsRefusedNamingTheSetting) {
  std::unique_ptr<Zone> first = Open(kOneMiB);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<Zone>> other =
      Zone::OpenOrCreate(zone_name_, 2 * kOneMiB, kRate);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("TRAFFICRATE_ZONE_SIZE"));
  EXPECT_THAT(other.status().message(), HasSubstr(first->path()));
  // The existing zone is untouched.
  EXPECT_EQ(first->header().zone_size, kOneMiB);
  EXPECT_EQ(ReadShm(zone_name_).size(), kOneMiB);
}

TEST_F(ZoneTest, OpenWithAnotherKeySpecIsRefusedNamingTheSetting) {
  KeySpec net24;
  net24.v4_prefix = 24;
  absl::StatusOr<std::unique_ptr<Zone>> first =
      Zone::OpenOrCreate(zone_name_, kOneMiB, kRate, net24);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->settings().key_spec().mode, KeyMode::kPeer);
  EXPECT_EQ((*first)->settings().key_spec().v4_prefix, 24);
  EXPECT_EQ((*first)->settings().key_spec().v6_prefix, 128);
  absl::StatusOr<std::unique_ptr<Zone>> same =
      Zone::OpenOrCreate(zone_name_, kOneMiB, kRate, net24);
  EXPECT_TRUE(same.ok()) << same.status();
  absl::StatusOr<std::unique_ptr<Zone>> other =
      Zone::OpenOrCreate(zone_name_, kOneMiB, 2 * kRate, KeySpec());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("TRAFFICRATE_KEY"));
  EXPECT_EQ((*first)->header().rate_bytes_per_sec.load(), kRate)
      << "a refused opener must not change the live rate";
  // The CLI attaches whatever the key spec.
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->settings().key_spec().v4_prefix, 24);
}

TEST_F(ZoneTest, SizeOutsideTheLimitsIsInvalidAndCreatesNothing) {
  for (const uint64_t size : {kMinZoneSize - 1, kMaxZoneSize + 1}) {
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(zone_name_, size, kRate);
    ASSERT_FALSE(zone.ok());
    EXPECT_EQ(zone.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Zone::Attach(zone_name_).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ZoneTest, AttachOfAMissingZoneIsNotFound) {
  absl::StatusOr<std::unique_ptr<Zone>> zone = Zone::Attach(zone_name_);
  ASSERT_FALSE(zone.ok());
  EXPECT_EQ(zone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(zone.status().message(), HasSubstr(zone_name_));
}

TEST_F(ZoneTest, UnlinkOfAMissingZoneIsNotFound) {
  EXPECT_EQ(ZoneSegment::Unlink(zone_name_).code(),
            absl::StatusCode::kNotFound);
}

// A zone whose header fails its check is corrupt: Attach (the CLI) says so
// (DataLoss), and a server starting replaces it with a fresh zone, without
// writing to the old one, which the processes still using it keep.
void ExpectCorruptAndReplaced(const std::string& zone_name,
                              const std::vector<uint8_t>& before,
                              const std::string& why) {
  ASSERT_EQ(before.size(), kOneMiB);
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name);
  ASSERT_FALSE(attached.ok());
  EXPECT_TRUE(ZoneSegment::IsCorruptZone(attached.status()))
      << attached.status();
  EXPECT_THAT(attached.status().message(), HasSubstr("corrupt"));
  EXPECT_THAT(attached.status().message(), HasSubstr(why));
  EXPECT_THAT(attached.status().message(), HasSubstr("trafficrate rm"));
  const int old_fd = open(ZonePathOf(zone_name).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0);
  ZoneOpenNotes notes;
  // Another rate: using the old zone would store it there.
  absl::StatusOr<std::unique_ptr<Zone>> opened =
      Zone::OpenOrCreate(zone_name, kOneMiB, 7 * kRate, KeySpec(), &notes);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(notes.replaced_corrupt);
  EXPECT_EQ((*opened)->header().magic, kZoneMagic);
  EXPECT_EQ((*opened)->header().rate_bytes_per_sec.load(), 7 * kRate);
  EXPECT_TRUE((*opened)->segment().CheckHeader());
  std::vector<uint8_t> old(before.size());
  EXPECT_EQ(pread(old_fd, old.data(), old.size(), 0),
            static_cast<ssize_t>(old.size()));
  close(old_fd);
  EXPECT_TRUE(old == before) << "the corrupt zone was written";
  EXPECT_TRUE(Zone::Attach(zone_name).ok());
}

TEST_F(ZoneTest, ZoneWithWrongMagicIsCorruptAndReplaced) {
  ExpectCorruptAndReplaced(
      zone_name_, CreateAndTamper([](ZoneHeaderShm& h) { h.magic ^= 1; }),
      "magic");
}

TEST_F(ZoneTest, ZoneWithAnotherLayoutVersionIsRefusedAndNeverWritten) {
  // A running server of another version may use it: never replaced.
  const std::vector<uint8_t> before = CreateAndTamper(
      [](ZoneHeaderShm& h) { h.layout_version = kZoneLayoutVersion + 1; });
  ASSERT_EQ(before.size(), kOneMiB);
  absl::StatusOr<std::unique_ptr<Zone>> opened =
      Zone::OpenOrCreate(zone_name_, kOneMiB, 7 * kRate);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("layout version"));
  EXPECT_THAT(opened.status().message(), HasSubstr("trafficrate rm --force"));
  EXPECT_TRUE(ZoneSegment::IsOtherLayout(opened.status()));
  EXPECT_FALSE(ZoneSegment::IsCorruptZone(opened.status()));
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ZoneSegment::IsOtherLayout(attached.status()));
  EXPECT_TRUE(ReadShm(zone_name_) == before) << "a refused zone was written";
}

TEST_F(ZoneTest, ZoneWithAnotherSlotSizeIsCorruptAndReplaced) {
  ExpectCorruptAndReplaced(zone_name_, CreateAndTamper([](ZoneHeaderShm& h) {
                             h.conn_slot_size = sizeof(ConnSlotShm) + 8;
                           }),
                           "checksum");
}

TEST_F(ZoneTest, EachImmutableHeaderByteIsCoveredByTheChecksum) {
  for (size_t offset = 0; offset < offsetof(ZoneHeaderShm, ready); ++offset) {
    if (offset == offsetof(ZoneHeaderShm, magic)) continue;  // "bad magic"
    SCOPED_TRACE(offset);
    const std::vector<uint8_t> before =
        CreateAndTamper([offset](ZoneHeaderShm& h) {
          reinterpret_cast<uint8_t*>(&h)[offset] ^= 0x40;
        });
    absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
    ASSERT_FALSE(attached.ok());
    // The layout version, changed, is refused as another version's zone.
    if (offset >= offsetof(ZoneHeaderShm, layout_version) &&
        offset < offsetof(ZoneHeaderShm, header_size)) {
      EXPECT_EQ(attached.status().code(),
                absl::StatusCode::kFailedPrecondition);
    } else {
      EXPECT_TRUE(ZoneSegment::IsCorruptZone(attached.status()))
          << attached.status();
    }
    ASSERT_TRUE(ZoneSegment::Unlink(zone_name_).ok());
  }
}

TEST_F(ZoneTest, ZoneWithInconsistentGeometryIsCorruptEvenWithItsChecksum) {
  ExpectCorruptAndReplaced(zone_name_, CreateAndTamper([](ZoneHeaderShm& h) {
                             h.key_capacity += 1;
                             h.header_checksum = ZoneHeaderChecksum(h);
                           }),
                           "inconsistent geometry");
}

TEST_F(ZoneTest, ZoneMarkedCorruptIsReplaced) {
  ExpectCorruptAndReplaced(
      zone_name_, CreateAndTamper([](ZoneHeaderShm& h) { h.corrupt.store(1); }),
      "marked corrupt");
}

TEST_F(ZoneTest, CheckHeaderFindsALiveZoneChangedAndMarksItForEveryone) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  std::unique_ptr<Zone> other = Open();
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(zone->segment().CheckHeader());
  EXPECT_TRUE(other->segment().CheckHeader());
  zone->header().hash_seed[1] ^= 1;
  EXPECT_FALSE(zone->segment().CheckHeader());
  EXPECT_TRUE(zone->segment().corrupt());
  zone->header().hash_seed[1] ^= 1;  // put back: the mark stays
  EXPECT_FALSE(other->segment().CheckHeader());
  EXPECT_TRUE(other->segment().corrupt());
  EXPECT_EQ(zone->header().corrupt.load(), 1u);
  // A corrupt zone is not locked any more in this process.
  ZoneLock lock(*zone);
  EXPECT_FALSE(lock.ok());
}

TEST_F(ZoneTest, HashSeedDiffersBetweenZones) {
  std::unique_ptr<Zone> a = Open();
  ASSERT_NE(a, nullptr);
  const std::string other_name = zone_name_ + "_other";
  (void)ZoneSegment::Unlink(other_name);
  absl::StatusOr<std::unique_ptr<Zone>> b =
      Zone::OpenOrCreate(other_name, kOneMiB, kRate);
  (void)ZoneSegment::Unlink(other_name);
  ASSERT_TRUE(b.ok()) << b.status();
  const ZoneHeaderShm& ha = a->header();
  const ZoneHeaderShm& hb = (*b)->header();
  EXPECT_FALSE(ha.hash_seed[0] == hb.hash_seed[0] &&
               ha.hash_seed[1] == hb.hash_seed[1]);
  EXPECT_FALSE(ha.hash_seed[0] == 0 && ha.hash_seed[1] == 0);
  // So the same keys land in different buckets.
  int differing = 0;
  for (uint32_t n = 0; n < 64; ++n) {
    if (a->keys().BucketOf(MakeKey(n).bytes) !=
        (*b)->keys().BucketOf(MakeKey(n).bytes)) {
      ++differing;
    }
  }
  EXPECT_GT(differing, 32);
}

TEST_F(ZoneTest, KeysAreFoundInsertedOnceAndReleasedWhenUnused) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 100);
  const uint32_t b = zone->keys().FindOrInsertLocked(MakeKey(2).bytes, 200);
  ASSERT_NE(a, kNoSlot);
  ASSERT_NE(b, kNoSlot);
  EXPECT_NE(a, b);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 300), a);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), b);
  EXPECT_EQ(zone->keys().slot(a).last_active_ns.load(), 100);
  EXPECT_EQ(zone->keys().slot(a).refs.load(), 0u);
  EXPECT_EQ(zone->header().keys_used, 2u);
  const uint32_t c = zone->conns().RegisterLocked(a, 0, 5, kPeer, 1);
  ASSERT_NE(c, kNoSlot);
  zone->keys().ReleaseIfUnusedLocked(a);  // still referenced: kept
  zone->keys().ReleaseIfUnusedLocked(b);  // unused: freed
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), a);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(2).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 1u);
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(1).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ZoneTest, JoinAndLeaveBumpTheGenerationOnlyOnChange) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c1 = RegisterLocked(*zone, 9, 0, 10);
  const uint32_t c2 = RegisterLocked(*zone, 9, 1, 11);
  ASSERT_NE(c1, kNoSlot);
  ASSERT_NE(c2, kNoSlot);
  const uint32_t k = zone->conns().slot(c1).key_index.load();
  EXPECT_EQ(zone->conns().slot(c2).key_index.load(), k);
  EXPECT_EQ(zone->keys().slot(k).refs.load(), 2u);
  EXPECT_EQ(zone->conns().slot(c1).fd.load(), 10);
  EXPECT_EQ(std::memcmp(zone->conns().slot(c1).peer, kPeer, 16), 0);
  EXPECT_EQ(zone->conns().slot(c1).peer_port, 4242);
  const uint32_t gen = zone->keys().slot(k).generation.load();
  EXPECT_TRUE(zone->conns().JoinLocked(c1));
  EXPECT_FALSE(zone->conns().JoinLocked(c1));
  EXPECT_TRUE(zone->conns().JoinLocked(c2));
  EXPECT_EQ(zone->keys().slot(k).active.load(), 2u);
  EXPECT_EQ(zone->keys().slot(k).generation.load(), gen + 2);
  EXPECT_TRUE(zone->conns().LeaveLocked(c1));
  EXPECT_FALSE(zone->conns().LeaveLocked(c1));
  EXPECT_EQ(zone->keys().slot(k).active.load(), 1u);
  EXPECT_EQ(zone->keys().slot(k).generation.load(), gen + 3);
  // Deregistering an active connection is a membership change.
  EXPECT_TRUE(zone->conns().DeregisterLocked(c2));
  EXPECT_FALSE(zone->conns().DeregisterLocked(c2));
  EXPECT_FALSE(zone->conns().JoinLocked(c2)) << "a freed slot cannot join";
  EXPECT_EQ(zone->keys().slot(k).active.load(), 0u);
  EXPECT_FALSE(zone->conns().DeregisterLocked(c1)) << "c1 had left already";
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_FALSE(zone->conns().JoinLocked(zone->conns().capacity()));
  EXPECT_FALSE(zone->conns().LeaveLocked(kNoSlot));
}

// Budget mode: the count of a key's connections under their pace (in
// budget_aux beside what the lease holder writes) follows the owners'
// marks, never counts a connection twice or one that left, and survives
// the holder's stores.
TEST_F(ZoneTest, UnderPaceCountFollowsMarksJoinsAndLeaves) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c1 = RegisterLocked(*zone, 9, 0, 10);
  const uint32_t c2 = RegisterLocked(*zone, 9, 1, 11);
  const uint32_t c3 = RegisterLocked(*zone, 9, 2, 12);
  ASSERT_NE(c3, kNoSlot);
  KeySlotShm& key = zone->keys().slot(zone->conns().slot(c1).key_index.load());
  zone->conns().SetUnderPace(c1, true);
  EXPECT_EQ(UnderPaceOf(key), 0u) << "not sending: not counted";
  ASSERT_TRUE(zone->conns().JoinLocked(c1));
  ASSERT_TRUE(zone->conns().JoinLocked(c2));
  ASSERT_TRUE(zone->conns().JoinLocked(c3));
  zone->conns().SetUnderPace(c1, true);
  zone->conns().SetUnderPace(c1, true);
  zone->conns().SetUnderPace(c2, true);
  EXPECT_EQ(UnderPaceOf(key), 2u);
  // The lease holder's store keeps the count.
  BudgetState state = LoadBudget(key);
  state.packet_bytes = 65536;
  state.under_ticks = 7;
  StoreBudget(key, state);
  EXPECT_EQ(UnderPaceOf(key), 2u);
  EXPECT_EQ(LoadBudget(key).packet_bytes, 65536u);
  EXPECT_EQ(LoadBudget(key).under_ticks, 7u);
  zone->conns().SetUnderPace(c2, false);
  zone->conns().SetUnderPace(c2, false);
  zone->conns().SetUnderPace(c3, false);
  EXPECT_EQ(UnderPaceOf(key), 1u);
  // A leave takes it off; so does a close of a connection still marked.
  ASSERT_TRUE(zone->conns().LeaveLocked(c1));
  EXPECT_EQ(UnderPaceOf(key), 0u);
  zone->conns().SetUnderPace(c3, true);
  EXPECT_EQ(UnderPaceOf(key), 1u);
  EXPECT_TRUE(zone->conns().DeregisterLocked(c3));
  EXPECT_EQ(UnderPaceOf(key), 0u);
  // A repair recounts it from the marks of the connections still there.
  zone->conns().SetUnderPace(c2, true);
  ASSERT_TRUE(zone->conns().JoinLocked(c1));
  zone->conns().SetUnderPace(c1, true);
  key.budget_aux.fetch_or(~kAuxHolderMask);  // a count gone wrong
  zone->RepairLocked();
  EXPECT_EQ(UnderPaceOf(key), 2u);
  EXPECT_EQ(LoadBudget(key).packet_bytes, 65536u);
}

TEST_F(ZoneTest, FreedConnectionSlotGetsANewCookie) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const uint32_t seq = zone->conns().slot(c).seq.load();
  EXPECT_EQ(seq & 1, 1u) << "odd while in use";
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->conns().slot(c).seq.load() & 1, 0u) << "even while free";
  const uint32_t again = RegisterLocked(*zone, 1, 0);
  ASSERT_EQ(again, c) << "the free list is LIFO";
  EXPECT_NE(ConnTable::CookieOf(zone->conns().slot(again).seq.load()),
            ConnTable::CookieOf(seq));
}

TEST_F(ZoneTest, RegisterRefusesIndicesOutOfRange) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t k = zone->keys().FindOrInsertLocked(MakeKey(1).bytes, 1);
  EXPECT_EQ(
      zone->conns().RegisterLocked(zone->keys().capacity(), 0, 1, kPeer, 1),
      kNoSlot);
  EXPECT_EQ(
      zone->conns().RegisterLocked(k, zone->procs().capacity(), 1, kPeer, 1),
      kNoSlot);
  EXPECT_EQ(zone->header().conns_used, 0u);
  zone->keys().ReleaseIfUnusedLocked(k);
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ZoneTest, FullKeyTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->keys().capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::set<uint32_t> slots;
  for (uint32_t n = 0; n < capacity; ++n) {
    const uint32_t k = zone->keys().FindOrInsertLocked(MakeKey(n).bytes, 1);
    ASSERT_NE(k, kNoSlot) << n;
    slots.insert(k);
  }
  EXPECT_EQ(slots.size(), capacity);
  EXPECT_EQ(zone->header().keys_used, capacity);
  EXPECT_EQ(zone->header().table_full.load(), 0u);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity).bytes, 1),
            kNoSlot);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 2u);
  // Every key is still found; an existing key needs no free slot.
  for (uint32_t n = 0; n < capacity; ++n) {
    ASSERT_NE(zone->keys().FindLocked(MakeKey(n).bytes), kNoSlot) << n;
  }
  EXPECT_NE(zone->keys().FindOrInsertLocked(MakeKey(3).bytes, 1), kNoSlot);
  // Freeing one makes room for exactly one more.
  const uint32_t freed = zone->keys().FindLocked(MakeKey(17).bytes);
  zone->keys().ReleaseIfUnusedLocked(freed);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(17).bytes), kNoSlot);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity).bytes, 1), freed);
  EXPECT_EQ(zone->keys().FindOrInsertLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  for (uint32_t n = 0; n <= capacity; ++n) {
    zone->keys().ReleaseIfUnusedLocked(
        zone->keys().FindLocked(MakeKey(n).bytes));
  }
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ZoneTest, FullConnectionTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->conns().capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::vector<uint32_t> conns;
  for (uint32_t i = 0; i < capacity; ++i) {
    const uint32_t c = RegisterLocked(*zone, i % 3, 0, static_cast<int>(i));
    ASSERT_NE(c, kNoSlot) << i;
    conns.push_back(c);
  }
  EXPECT_EQ(zone->header().conns_used, capacity);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), capacity);
  // Full: a new key is inserted but the connection is refused; the helper
  // then releases the key, as the Governor does.
  EXPECT_EQ(RegisterLocked(*zone, 99, 0), kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 1u);
  EXPECT_EQ(zone->keys().FindLocked(MakeKey(99).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 3u);
  // After a free, registering works again.
  EXPECT_FALSE(zone->conns().DeregisterLocked(conns.back()));
  conns.pop_back();
  const uint32_t c = RegisterLocked(*zone, 99, 0);
  ASSERT_NE(c, kNoSlot);
  conns.push_back(c);
  EXPECT_EQ(RegisterLocked(*zone, 98, 0), kNoSlot);
  for (const uint32_t conn : conns) zone->conns().DeregisterLocked(conn);
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_EQ(zone->header().keys_used, 0u);
  EXPECT_EQ(zone->procs().slot(0).conns.load(), 0u);
}

// Passed sockets: the handoff table in the header.
TEST_F(ZoneTest, HandoffIsTakenOnceByInodeWhileItsConnectionLives) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const uint32_t cookie = ConnTable::CookieOf(zone->conns().slot(c).seq.load());
  EXPECT_FALSE(zone->handoffs().MayHave(77));
  ASSERT_TRUE(zone->handoffs().PublishLocked(77, c, cookie, 0, 1000));
  EXPECT_TRUE(zone->handoffs().MayHave(77));
  EXPECT_FALSE(zone->handoffs().MayHave(78));
  EXPECT_TRUE(zone->handoffs().PendingLocked(c, cookie));
  EXPECT_FALSE(zone->handoffs().PendingLocked(c, cookie + 1));
  uint32_t got = 0;
  EXPECT_EQ(zone->handoffs().TakeLocked(78, &got), kNoSlot);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), c);
  EXPECT_EQ(got, cookie);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), kNoSlot) << "taken once";
  EXPECT_FALSE(zone->handoffs().PendingLocked(c, cookie));
  // A connection that ended meanwhile is not handed over.
  ASSERT_TRUE(zone->handoffs().PublishLocked(77, c, cookie, 0, 1000));
  zone->conns().DeregisterLocked(c);
  EXPECT_EQ(zone->handoffs().TakeLocked(77, &got), kNoSlot);
  EXPECT_FALSE(zone->handoffs().MayHave(77)) << "and the slot is freed";
  // Inode 0 (no socket) and a slot index beyond the table are refused.
  EXPECT_FALSE(zone->handoffs().PublishLocked(0, c, cookie, 0, 1000));
  EXPECT_FALSE(zone->handoffs().PublishLocked(5, zone->conns().capacity(),
                                              cookie, 0, 1000));
}

TEST_F(ZoneTest, LatestWatcherLateNsIsThatOfLiveProcessesWithConnections) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  uint32_t a = kNoSlot, b = kNoSlot;
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    a = zone->procs().ClaimLocked(getpid(), 1);
    b = zone->procs().ClaimLocked(getpid() + 1, 1);
  }
  ASSERT_NE(a, kNoSlot);
  ASSERT_NE(b, kNoSlot);
  const int64_t now = int64_t{5000} * kNsPerMs;
  const int64_t most = 2 * kNsPerSec;
  EXPECT_EQ(zone->procs().slot(a).watcher_due_ms.load(), 0u)
      << "a claim clears it";
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0);
  zone->procs().slot(a).watcher_due_ms.store(4700);
  zone->procs().slot(b).watcher_due_ms.store(4900);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0)
      << "processes with no connections are not waited for";
  zone->procs().slot(a).conns.store(1);
  zone->procs().slot(b).conns.store(2);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 300 * kNsPerMs);
  zone->procs().slot(a).watcher_due_ms.store(5100);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 100 * kNsPerMs)
      << "one due later is early, not late";
  zone->procs().slot(b).watcher_due_ms.store(2000);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(now, most), 0)
      << "3 s late: stopped, not late";
  // Milliseconds wrap; their difference does not.
  const int64_t wrapped = (int64_t{1} << 32) * kNsPerMs + 10 * kNsPerMs;
  zone->procs().slot(b).watcher_due_ms.store(0xFFFFFFF0u);
  EXPECT_EQ(zone->procs().LatestWatcherLateNs(wrapped, most), 26 * kNsPerMs);
}

TEST_F(ZoneTest, HandoffsAreWithdrawnExpiredAndReapedPerProcess) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const uint32_t a = RegisterLocked(*zone, 1, 0);
  const uint32_t b = RegisterLocked(*zone, 2, 1);
  ASSERT_TRUE(zone->handoffs().PublishLocked(10, a, 1, 0, 1000));
  ASSERT_TRUE(zone->handoffs().PublishLocked(11, b, 1, 1, 1000));
  zone->handoffs().WithdrawLocked(10, 1);
  EXPECT_TRUE(zone->handoffs().MayHave(10)) << "only its sender withdraws it";
  zone->handoffs().WithdrawLocked(10, 0);
  EXPECT_FALSE(zone->handoffs().MayHave(10));
  ASSERT_TRUE(zone->handoffs().PublishLocked(10, a, 1, 0, 5000));
  EXPECT_FALSE(zone->handoffs().HasOld(0, 5000));
  EXPECT_TRUE(zone->handoffs().HasOld(0, 5001));
  uint64_t out[kMinHandoffSlots];
  EXPECT_EQ(zone->handoffs().ExpireLocked(0, 5000, out, kMinHandoffSlots), 0u);
  ASSERT_EQ(zone->handoffs().ExpireLocked(0, 5001, out, kMinHandoffSlots), 1u);
  EXPECT_EQ(out[0], uint64_t{a} << 32 | 1);
  EXPECT_FALSE(zone->handoffs().MayHave(10));
  EXPECT_TRUE(zone->handoffs().MayHave(11)) << "another process's stays";
}

TEST_F(ZoneTest, HandoffTableFullRefusesThenReusesStaleOrGarbageSlots) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  // Sized from the zone: an eighth of its connection slots.
  EXPECT_EQ(zone->handoffs().capacity(), zone->conns().capacity() / 8);
  EXPECT_GT(zone->handoffs().capacity(), kMinHandoffSlots);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const int64_t now = 100 * kNsPerSec;
  std::vector<uint32_t> conns;
  for (uint64_t i = 0; i < zone->handoffs().capacity(); ++i) {
    conns.push_back(RegisterLocked(*zone, 1, 0));
    ASSERT_NE(conns.back(), kNoSlot);
    ASSERT_TRUE(
        zone->handoffs().PublishLocked(100 + i, conns.back(), 1, 0, now));
  }
  EXPECT_EQ(zone->header().handoffs_pending.load(),
            zone->handoffs().capacity());
  const uint32_t c = RegisterLocked(*zone, 2, 0);
  EXPECT_FALSE(zone->handoffs().PublishLocked(999, c, 1, 0, now)) << "full";
  EXPECT_TRUE(zone->handoffs().PublishLocked(100, conns[0], 1, 0, now))
      << "the same one";
  // Garbage (a slot naming no process) and a slot dated far ahead are free
  // for others; so is one left for far longer than any sender keeps it.
  zone->handoffs().slot(3).proc.store(kNoSlot);
  EXPECT_TRUE(zone->handoffs().PublishLocked(999, c, 1, 0, now));
  EXPECT_EQ(zone->handoffs().slot(3).inode.load(), 999u);
  EXPECT_TRUE(zone->handoffs().MayBeHandedOff(c, 1));
  EXPECT_FALSE(zone->handoffs().MayBeHandedOff(conns[3], 1))
      << "its slot was taken";
  zone->handoffs().slot(4).since_ns.store(INT64_MAX);
  const uint32_t d = RegisterLocked(*zone, 3, 0);
  EXPECT_TRUE(zone->handoffs().PublishLocked(998, d, 1, 0, now));
  const uint32_t e = RegisterLocked(*zone, 4, 0);
  EXPECT_TRUE(
      zone->handoffs().PublishLocked(997, e, 1, 0, now + 60 * kNsPerSec));
  EXPECT_EQ(zone->header().handoffs_pending.load(),
            zone->handoffs().capacity());
}

TEST_F(ZoneTest, ExpiringHandoffsTakesABatchAndLeavesTheRest) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  EXPECT_FALSE(zone->handoffs().AnyPending());
  for (uint64_t i = 0; i < 3 * kMinHandoffSlots; ++i) {
    const uint32_t c = RegisterLocked(*zone, 1, 0);
    ASSERT_TRUE(zone->handoffs().PublishLocked(100 + i, c, 1, 0, 1000));
  }
  EXPECT_TRUE(zone->handoffs().AnyPending());
  uint64_t out[kMinHandoffSlots];
  for (int batch = 0; batch < 3; ++batch) {
    EXPECT_TRUE(zone->handoffs().HasOld(0, 2000));
    EXPECT_EQ(zone->handoffs().ExpireLocked(0, 2000, out, kMinHandoffSlots),
              kMinHandoffSlots);
  }
  EXPECT_FALSE(zone->handoffs().HasOld(0, 2000));
  EXPECT_FALSE(zone->handoffs().AnyPending());
  EXPECT_EQ(zone->header().handoffs_pending.load(), 0u);
}

}  // namespace
}  // namespace trafficrate
