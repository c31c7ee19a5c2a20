// The zone's segment: making, attaching and validating a zone file (a zone
// of another size, key spec or layout is refused, and a refused one is never
// written), the tables handed to the parts (the geometry validated at
// attach, kept by the process), and corruption (a corrupt zone is replaced
// by the next server, and marked for every process that maps it).

#include "src/shm/zone_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/clock.h"
#include "src/net/key.h"
#include "src/shm/zone_file.h"
#include "src/shm/zone_layout.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using testing_util::kOneMiB;
using testing_util::kRate;

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

class ZoneSegmentTest : public testing_util::ZoneFixture {
 protected:
  // Creates a zone, closes it, then lets `tamper` change its header in the
  // zone file. Returns the file's bytes after tampering.
  template <typename Tamper>
  std::vector<uint8_t> CreateAndTamper(Tamper tamper) {
    if (Open<ZoneSegment>() == nullptr) return {};
    RawHeader raw(zone_name_);
    if (raw.get() == nullptr) return {};
    tamper(*raw.get());
    return ReadShm(zone_name_);
  }
};

TEST_F(ZoneSegmentTest, TheTablesAreTheGeometryOfItsSizeInThisMapping) {
  std::unique_ptr<ZoneSegment> segment = Open<ZoneSegment>();
  ASSERT_NE(segment, nullptr);
  const ZoneHeaderShm& h = segment->header();
  const ZoneGeometry g = ComputeZoneGeometry(kOneMiB);
  EXPECT_EQ(h.magic, kZoneMagic);
  EXPECT_EQ(h.layout_version, kZoneLayoutVersion);
  EXPECT_EQ(h.zone_size, kOneMiB);
  EXPECT_EQ(h.ready.load(), 1u);
  EXPECT_EQ(h.rate_bytes_per_sec.load(), kRate);
  EXPECT_EQ(h.key_free_head, 0u);
  EXPECT_EQ(h.conn_free_head, 0u);
  EXPECT_EQ(segment->name(), zone_name_);
  const ZoneTables& t = segment->tables();
  const auto* base = static_cast<const uint8_t*>(t.base);
  EXPECT_EQ(static_cast<const void*>(t.header), t.base);
  EXPECT_EQ(t.size, kOneMiB);
  EXPECT_EQ(t.bucket_count, g.bucket_count);
  EXPECT_EQ(t.key_capacity, g.key_capacity);
  EXPECT_EQ(t.conn_capacity, g.conn_capacity);
  EXPECT_EQ(t.proc_capacity, g.proc_capacity);
  EXPECT_EQ(t.handoff_capacity, g.handoff_capacity);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.buckets),
            base + g.buckets_offset);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.keys), base + g.keys_offset);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.conns), base + g.conns_offset);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.procs), base + g.procs_offset);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(t.handoffs),
            base + g.handoffs_offset);
  // Every bucket empty, the free lists in order.
  EXPECT_EQ(t.buckets[0], kNoSlot);
  EXPECT_EQ(t.buckets[t.bucket_count - 1], kNoSlot);
  EXPECT_EQ(t.keys[0].next, 1u);
  EXPECT_EQ(t.keys[t.key_capacity - 1].next, kNoSlot);
  EXPECT_EQ(t.conns[0].next_free, 1u);
  EXPECT_EQ(t.conns[0].key_index.load(), kNoSlot);
  // Read once: a geometry written into the header later changes nothing.
  segment->header().key_capacity = 0xfffffff0u;
  segment->header().keys_offset = ~0ull;
  EXPECT_EQ(segment->tables().key_capacity, g.key_capacity);
  EXPECT_EQ(segment->tables().keys, t.keys);
}

TEST_F(ZoneSegmentTest, AKeySpecIsStoredInThreeBytes) {
  KeySpec spec;
  spec.mode = KeyMode::kPeer;
  spec.v4_prefix = 24;
  spec.v6_prefix = 56;
  EXPECT_EQ(PackKeySpec(spec),
            static_cast<uint32_t>(KeyMode::kPeer) | 24u << 8 | 56u << 16);
  const KeySpec back = UnpackKeySpec(PackKeySpec(spec));
  EXPECT_EQ(back.mode, spec.mode);
  EXPECT_EQ(back.v4_prefix, 24);
  EXPECT_EQ(back.v6_prefix, 56);
}

TEST_F(ZoneSegmentTest, AttachSeesAnExistingZoneOfAnySize) {
  std::unique_ptr<ZoneSegment> created = Open<ZoneSegment>(2 * kOneMiB);
  ASSERT_NE(created, nullptr);
  absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
      ZoneSegment::Attach(zone_name_);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->header().zone_size, 2 * kOneMiB);
  EXPECT_EQ((*attached)->tables().key_capacity, created->tables().key_capacity);
  // Attach is for the CLI: it does not touch the live rate.
  EXPECT_EQ((*attached)->header().rate_bytes_per_sec.load(), kRate);
}

TEST_F(ZoneSegmentTest, OpenWithAnotherSizeIsRefusedNamingTheSetting) {
  std::unique_ptr<ZoneSegment> first = Open<ZoneSegment>(kOneMiB);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<ZoneSegment>> other =
      ZoneSegment::OpenOrCreate(zone_name_, 2 * kOneMiB, kRate);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("TRAFFICRATE_ZONE_SIZE"));
  EXPECT_THAT(other.status().message(), HasSubstr(first->path()));
  // The existing zone is untouched.
  EXPECT_EQ(first->header().zone_size, kOneMiB);
  EXPECT_EQ(ReadShm(zone_name_).size(), kOneMiB);
}

TEST_F(ZoneSegmentTest, OpenWithAnotherKeySpecIsRefusedNamingTheSetting) {
  KeySpec net24;
  net24.v4_prefix = 24;
  absl::StatusOr<std::unique_ptr<ZoneSegment>> first =
      ZoneSegment::OpenOrCreate(zone_name_, kOneMiB, kRate, net24);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(UnpackKeySpec((*first)->header().key_spec).mode, KeyMode::kPeer);
  EXPECT_EQ(UnpackKeySpec((*first)->header().key_spec).v4_prefix, 24);
  EXPECT_EQ(UnpackKeySpec((*first)->header().key_spec).v6_prefix, 128);
  absl::StatusOr<std::unique_ptr<ZoneSegment>> same =
      ZoneSegment::OpenOrCreate(zone_name_, kOneMiB, kRate, net24);
  EXPECT_TRUE(same.ok()) << same.status();
  absl::StatusOr<std::unique_ptr<ZoneSegment>> other =
      ZoneSegment::OpenOrCreate(zone_name_, kOneMiB, 2 * kRate, KeySpec());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("TRAFFICRATE_KEY"));
  EXPECT_EQ((*first)->header().rate_bytes_per_sec.load(), kRate)
      << "a refused opener must not change the live rate";
  // The CLI attaches whatever the key spec.
  absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
      ZoneSegment::Attach(zone_name_);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(UnpackKeySpec((*attached)->header().key_spec).v4_prefix, 24);
}

TEST_F(ZoneSegmentTest, SizeOutsideTheLimitsIsInvalidAndCreatesNothing) {
  for (const uint64_t size : {kMinZoneSize - 1, kMaxZoneSize + 1}) {
    absl::StatusOr<std::unique_ptr<ZoneSegment>> zone =
        ZoneSegment::OpenOrCreate(zone_name_, size, kRate);
    ASSERT_FALSE(zone.ok());
    EXPECT_EQ(zone.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(ZoneSegment::Attach(zone_name_).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ZoneSegmentTest, AttachOfAMissingZoneIsNotFound) {
  absl::StatusOr<std::unique_ptr<ZoneSegment>> zone =
      ZoneSegment::Attach(zone_name_);
  ASSERT_FALSE(zone.ok());
  EXPECT_EQ(zone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(zone.status().message(), HasSubstr(zone_name_));
}

TEST_F(ZoneSegmentTest, UnlinkOfAMissingZoneIsNotFound) {
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
  absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
      ZoneSegment::Attach(zone_name);
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
  absl::StatusOr<std::unique_ptr<ZoneSegment>> opened =
      ZoneSegment::OpenOrCreate(zone_name, kOneMiB, 7 * kRate, KeySpec(),
                                &notes);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(notes.replaced_corrupt);
  EXPECT_EQ((*opened)->header().magic, kZoneMagic);
  EXPECT_EQ((*opened)->header().rate_bytes_per_sec.load(), 7 * kRate);
  EXPECT_TRUE((*opened)->CheckHeader());
  std::vector<uint8_t> old(before.size());
  EXPECT_EQ(pread(old_fd, old.data(), old.size(), 0),
            static_cast<ssize_t>(old.size()));
  close(old_fd);
  EXPECT_TRUE(old == before) << "the corrupt zone was written";
  EXPECT_TRUE(ZoneSegment::Attach(zone_name).ok());
}

TEST_F(ZoneSegmentTest, ZoneWithWrongMagicIsCorruptAndReplaced) {
  ExpectCorruptAndReplaced(
      zone_name_, CreateAndTamper([](ZoneHeaderShm& h) { h.magic ^= 1; }),
      "magic");
}

TEST_F(ZoneSegmentTest, ZoneWithAnotherLayoutVersionIsRefusedAndNeverWritten) {
  // A running server of another version may use it: never replaced.
  const std::vector<uint8_t> before = CreateAndTamper(
      [](ZoneHeaderShm& h) { h.layout_version = kZoneLayoutVersion + 1; });
  ASSERT_EQ(before.size(), kOneMiB);
  absl::StatusOr<std::unique_ptr<ZoneSegment>> opened =
      ZoneSegment::OpenOrCreate(zone_name_, kOneMiB, 7 * kRate);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("layout version"));
  EXPECT_THAT(opened.status().message(), HasSubstr("trafficrate rm --force"));
  EXPECT_TRUE(ZoneSegment::IsOtherLayout(opened.status()));
  EXPECT_FALSE(ZoneSegment::IsCorruptZone(opened.status()));
  absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
      ZoneSegment::Attach(zone_name_);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ZoneSegment::IsOtherLayout(attached.status()));
  EXPECT_TRUE(ReadShm(zone_name_) == before) << "a refused zone was written";
}

TEST_F(ZoneSegmentTest, ZoneWithAnotherSlotSizeIsCorruptAndReplaced) {
  ExpectCorruptAndReplaced(zone_name_, CreateAndTamper([](ZoneHeaderShm& h) {
                             h.conn_slot_size = sizeof(ConnSlotShm) + 8;
                           }),
                           "checksum");
}

TEST_F(ZoneSegmentTest, EachImmutableHeaderByteIsCoveredByTheChecksum) {
  for (size_t offset = 0; offset < offsetof(ZoneHeaderShm, ready); ++offset) {
    if (offset == offsetof(ZoneHeaderShm, magic)) continue;  // "bad magic"
    SCOPED_TRACE(offset);
    const std::vector<uint8_t> before =
        CreateAndTamper([offset](ZoneHeaderShm& h) {
          reinterpret_cast<uint8_t*>(&h)[offset] ^= 0x40;
        });
    absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
        ZoneSegment::Attach(zone_name_);
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

TEST_F(ZoneSegmentTest,
       ZoneWithInconsistentGeometryIsCorruptEvenWithItsChecksum) {
  ExpectCorruptAndReplaced(zone_name_, CreateAndTamper([](ZoneHeaderShm& h) {
                             h.key_capacity += 1;
                             h.header_checksum = ZoneHeaderChecksum(h);
                           }),
                           "inconsistent geometry");
}

TEST_F(ZoneSegmentTest, ZoneMarkedCorruptIsReplaced) {
  ExpectCorruptAndReplaced(
      zone_name_, CreateAndTamper([](ZoneHeaderShm& h) { h.corrupt.store(1); }),
      "marked corrupt");
}

// A creator that died before it published the zone: an opener waits for it
// a bounded time (2 s), then finds it corrupt (which a server replaces).
TEST_F(ZoneSegmentTest, AZoneNeverMadeReadyIsCorruptAfterABoundedWait) {
  ASSERT_EQ(CreateAndTamper([](ZoneHeaderShm& h) { h.ready.store(0); }).size(),
            kOneMiB);
  const int64_t start = MonotonicNowNs();
  absl::StatusOr<std::unique_ptr<ZoneSegment>> attached =
      ZoneSegment::Attach(zone_name_);
  const int64_t waited = MonotonicNowNs() - start;
  ASSERT_FALSE(attached.ok());
  EXPECT_TRUE(ZoneSegment::IsCorruptZone(attached.status()));
  EXPECT_THAT(attached.status().message(), HasSubstr("never initialized"));
  EXPECT_GE(waited, 2 * kNsPerSec - kNsPerMs);
  EXPECT_LT(waited, 2 * kNsPerSec + testing_util::kWaitNs);
}

TEST_F(ZoneSegmentTest, CheckHeaderFindsALiveZoneChangedAndMarksItForEveryone) {
  std::unique_ptr<ZoneSegment> zone = Open<ZoneSegment>();
  ASSERT_NE(zone, nullptr);
  std::unique_ptr<ZoneSegment> other = Open<ZoneSegment>();
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(zone->CheckHeader());
  EXPECT_TRUE(other->CheckHeader());
  zone->header().hash_seed[1] ^= 1;
  EXPECT_FALSE(zone->CheckHeader());
  EXPECT_TRUE(zone->corrupt());
  zone->header().hash_seed[1] ^= 1;  // put back: the mark stays
  EXPECT_FALSE(other->CheckHeader());
  EXPECT_TRUE(other->corrupt());
  EXPECT_EQ(zone->header().corrupt.load(), 1u);
  EXPECT_STREQ(zone->corrupt_why(), "its header checksum does not match");
  EXPECT_STREQ(other->corrupt_why(), "another process found it corrupt");
}

TEST_F(ZoneSegmentTest, HeaderIntactLooksWithoutMarkingAnything) {
  std::unique_ptr<ZoneSegment> zone = Open<ZoneSegment>();
  ASSERT_NE(zone, nullptr);
  EXPECT_TRUE(zone->HeaderIntact());
  zone->header().hash_seed[0] ^= 1;
  EXPECT_FALSE(zone->HeaderIntact());
  EXPECT_FALSE(zone->corrupt());
  EXPECT_EQ(zone->header().corrupt.load(), 0u);
  zone->header().hash_seed[0] ^= 1;
  EXPECT_TRUE(zone->HeaderIntact());
  const absl::Status status = zone->CorruptStatus("what it found");
  EXPECT_TRUE(ZoneSegment::IsCorruptZone(status));
  EXPECT_THAT(status.message(), HasSubstr(zone->path()));
  EXPECT_THAT(status.message(), HasSubstr("what it found"));
  EXPECT_THAT(status.message(), HasSubstr("trafficrate rm --zone"));
  // A mark, once made, stays: the first reason is kept.
  zone->MarkCorrupt("first");
  zone->MarkCorrupt("second");
  EXPECT_FALSE(zone->HeaderIntact());
  EXPECT_STREQ(zone->corrupt_why(), "first");
  zone->ForgetCorruptionForTesting();
  EXPECT_TRUE(zone->HeaderIntact());
  EXPECT_EQ(zone->corrupt_why(), nullptr);
}

}  // namespace
}  // namespace trafficrate
