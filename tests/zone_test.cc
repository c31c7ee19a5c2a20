#include "src/zone.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/clock.h"
#include "src/zone_layout.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using testing_util::ExitedWith;
using testing_util::kUnderTsan;
using testing_util::kWaitNs;
using testing_util::MutexReleaser;
using testing_util::Pipe;
using testing_util::PollUntil;
using testing_util::ReadByte;
using testing_util::WaitChild;
using testing_util::WriteByte;

constexpr uint64_t kOneMiB = uint64_t{1} << 20;
constexpr uint64_t kRate = 1'000'000;

// Distinct 20-byte keys: n in the first four bytes, tag in the fifth.
struct TestKey {
  uint8_t bytes[kKeyBytes] = {};
};
TestKey MakeKey(uint32_t n, uint8_t tag = 0) {
  TestKey k;
  std::memcpy(k.bytes, &n, sizeof(n));
  k.bytes[4] = tag;
  k.bytes[19] = 0x5a;
  return k;
}

const uint8_t kPeer[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                           0, 0, 0xff, 0xff, 127, 0, 0, 1};

// Reads the robust mutex word, as Zone::ProcMaybeDead does for proc slots.
bool OwnerDied(const pthread_mutex_t& mutex) {
  return (__atomic_load_n(&mutex.__data.__lock, __ATOMIC_ACQUIRE) &
          FUTEX_OWNER_DIED) != 0;
}

// Copies the whole shm object, to show that a refused zone was not written.
std::vector<uint8_t> ReadShm(const std::string& zone_name) {
  const std::string shm = ZoneShmName(zone_name);
  const int fd = shm_open(shm.c_str(), O_RDONLY, 0);
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
    const std::string shm = ZoneShmName(zone_name);
    const int fd = shm_open(shm.c_str(), O_RDWR, 0);
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

class ZoneTest : public testing_util::ZoneNameFixture {
 protected:
  std::unique_ptr<Zone> Open(uint64_t size = kOneMiB, uint64_t rate = kRate) {
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(zone_name_, size, rate);
    EXPECT_TRUE(zone.ok()) << zone.status();
    return zone.ok() ? std::move(*zone) : nullptr;
  }

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

  // Registers a connection for key n, owned by proc; returns its slot.
  static uint32_t RegisterLocked(Zone& zone, uint32_t n, uint32_t proc,
                                 int fd = 7) {
    const TestKey key = MakeKey(n);
    const uint32_t k = zone.FindOrInsertKeyLocked(key.bytes, 1);
    if (k == kNoSlot) return kNoSlot;
    const uint32_t c = zone.RegisterConnLocked(k, proc, fd, kPeer, 4242);
    if (c == kNoSlot) zone.ReleaseKeyIfUnusedLocked(k);
    return c;
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
  EXPECT_EQ(zone->key_capacity(), g.key_capacity);
  EXPECT_EQ(zone->conn_capacity(), g.conn_capacity);
  EXPECT_EQ(zone->proc_capacity(), g.proc_capacity);
  EXPECT_EQ(zone->name(), zone_name_);
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  EXPECT_EQ(h.keys_used, 0u);
  EXPECT_EQ(h.conns_used, 0u);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(1).bytes), kNoSlot);
}

TEST_F(ZoneTest, ShmNameIsPrefixed) {
  EXPECT_EQ(ZoneShmName("default"), "/trafficrate.default");
  EXPECT_EQ(ZoneShmName("a.b"), "/trafficrate.a.b");
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
    EXPECT_TRUE(first->JoinLocked(conn));
  }
  std::unique_ptr<Zone> second = Open();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->header().hash_seed[0], first->header().hash_seed[0]);
  EXPECT_EQ(second->header().hash_seed[1], first->header().hash_seed[1]);
  {
    ZoneLock lock(*second);
    ASSERT_TRUE(lock.ok());
    const uint32_t k = second->FindKeyLocked(MakeKey(42).bytes);
    ASSERT_NE(k, kNoSlot);
    EXPECT_EQ(second->key(k).refs, 1u);
    EXPECT_EQ(second->key(k).active.load(), 1u);
    EXPECT_EQ(second->conn(conn).key_index.load(), k);
    EXPECT_EQ(second->conn(conn).proc_index.load(), 3u);
    EXPECT_EQ(second->header().conns_used, 1u);
    // A change through the second mapping shows in the first.
    EXPECT_TRUE(second->DeregisterConnLocked(conn));
  }
  ZoneLock lock(*first);
  EXPECT_EQ(first->header().conns_used, 0u);
  EXPECT_EQ(first->header().keys_used, 0u);
  EXPECT_EQ(first->FindKeyLocked(MakeKey(42).bytes), kNoSlot);
}

TEST_F(ZoneTest, AttachSeesAnExistingZoneOfAnySize) {
  std::unique_ptr<Zone> created = Open(2 * kOneMiB);
  ASSERT_NE(created, nullptr);
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ((*attached)->header().zone_size, 2 * kOneMiB);
  EXPECT_EQ((*attached)->key_capacity(), created->key_capacity());
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
  EXPECT_THAT(other.status().message(), HasSubstr(ZoneShmName(zone_name_)));
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
  EXPECT_EQ((*first)->key_spec().mode, KeyMode::kPeer);
  EXPECT_EQ((*first)->key_spec().v4_prefix, 24);
  EXPECT_EQ((*first)->key_spec().v6_prefix, 128);
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
  EXPECT_EQ((*attached)->key_spec().v4_prefix, 24);
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
  EXPECT_EQ(Zone::Unlink(zone_name_).code(), absl::StatusCode::kNotFound);
}

TEST_F(ZoneTest, ZoneWithWrongMagicIsRefusedAndNeverWritten) {
  const std::vector<uint8_t> before =
      CreateAndTamper([](ZoneHeaderShm& h) { h.magic ^= 1; });
  ASSERT_EQ(before.size(), kOneMiB);
  // Another rate: using the zone would store it.
  absl::StatusOr<std::unique_ptr<Zone>> opened =
      Zone::OpenOrCreate(zone_name_, kOneMiB, 7 * kRate);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("magic"));
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReadShm(zone_name_) == before) << "a refused zone was written";
}

TEST_F(ZoneTest, ZoneWithAnotherLayoutVersionIsRefusedAndNeverWritten) {
  const std::vector<uint8_t> before = CreateAndTamper(
      [](ZoneHeaderShm& h) { h.layout_version = kZoneLayoutVersion + 1; });
  ASSERT_EQ(before.size(), kOneMiB);
  absl::StatusOr<std::unique_ptr<Zone>> opened =
      Zone::OpenOrCreate(zone_name_, kOneMiB, 7 * kRate);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("layout version"));
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReadShm(zone_name_) == before) << "a refused zone was written";
}

TEST_F(ZoneTest, ZoneWithAnotherSlotSizeIsRefused) {
  const std::vector<uint8_t> before = CreateAndTamper(
      [](ZoneHeaderShm& h) { h.conn_slot_size = sizeof(ConnSlotShm) + 8; });
  ASSERT_EQ(before.size(), kOneMiB);
  EXPECT_EQ(Zone::OpenOrCreate(zone_name_, kOneMiB, kRate).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReadShm(zone_name_) == before);
}

TEST_F(ZoneTest, ZoneWithInconsistentGeometryIsRefused) {
  const std::vector<uint8_t> before =
      CreateAndTamper([](ZoneHeaderShm& h) { h.key_capacity += 1; });
  ASSERT_EQ(before.size(), kOneMiB);
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(zone_name_);
  ASSERT_FALSE(attached.ok());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Zone::OpenOrCreate(zone_name_, kOneMiB, kRate).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReadShm(zone_name_) == before);
}

TEST_F(ZoneTest, HashSeedDiffersBetweenZones) {
  std::unique_ptr<Zone> a = Open();
  ASSERT_NE(a, nullptr);
  const std::string other_name = zone_name_ + "_other";
  (void)Zone::Unlink(other_name);
  absl::StatusOr<std::unique_ptr<Zone>> b =
      Zone::OpenOrCreate(other_name, kOneMiB, kRate);
  (void)Zone::Unlink(other_name);
  ASSERT_TRUE(b.ok()) << b.status();
  const ZoneHeaderShm& ha = a->header();
  const ZoneHeaderShm& hb = (*b)->header();
  EXPECT_FALSE(ha.hash_seed[0] == hb.hash_seed[0] &&
               ha.hash_seed[1] == hb.hash_seed[1]);
  EXPECT_FALSE(ha.hash_seed[0] == 0 && ha.hash_seed[1] == 0);
  // So the same keys land in different buckets.
  int differing = 0;
  for (uint32_t n = 0; n < 64; ++n) {
    if (a->BucketOf(MakeKey(n).bytes) != (*b)->BucketOf(MakeKey(n).bytes)) {
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
  const uint32_t a = zone->FindOrInsertKeyLocked(MakeKey(1).bytes, 100);
  const uint32_t b = zone->FindOrInsertKeyLocked(MakeKey(2).bytes, 200);
  ASSERT_NE(a, kNoSlot);
  ASSERT_NE(b, kNoSlot);
  EXPECT_NE(a, b);
  EXPECT_EQ(zone->FindOrInsertKeyLocked(MakeKey(1).bytes, 300), a);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(2).bytes), b);
  EXPECT_EQ(zone->key(a).created_ns, 100);
  EXPECT_EQ(zone->key(a).refs, 0u);
  EXPECT_EQ(zone->header().keys_used, 2u);
  const uint32_t c = zone->RegisterConnLocked(a, 0, 5, kPeer, 1);
  ASSERT_NE(c, kNoSlot);
  zone->ReleaseKeyIfUnusedLocked(a);  // still referenced: kept
  zone->ReleaseKeyIfUnusedLocked(b);  // unused: freed
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(1).bytes), a);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(2).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 1u);
  zone->DeregisterConnLocked(c);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(1).bytes), kNoSlot);
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
  const uint32_t k = zone->conn(c1).key_index.load();
  EXPECT_EQ(zone->conn(c2).key_index.load(), k);
  EXPECT_EQ(zone->key(k).refs, 2u);
  EXPECT_EQ(zone->conn(c1).fd.load(), 10);
  EXPECT_EQ(std::memcmp(zone->conn(c1).peer, kPeer, 16), 0);
  EXPECT_EQ(zone->conn(c1).peer_port, 4242);
  const uint32_t gen = zone->key(k).generation.load();
  EXPECT_TRUE(zone->JoinLocked(c1));
  EXPECT_FALSE(zone->JoinLocked(c1));
  EXPECT_TRUE(zone->JoinLocked(c2));
  EXPECT_EQ(zone->key(k).active.load(), 2u);
  EXPECT_EQ(zone->key(k).generation.load(), gen + 2);
  EXPECT_TRUE(zone->LeaveLocked(c1));
  EXPECT_FALSE(zone->LeaveLocked(c1));
  EXPECT_EQ(zone->key(k).active.load(), 1u);
  EXPECT_EQ(zone->key(k).generation.load(), gen + 3);
  // Deregistering an active connection is a membership change.
  EXPECT_TRUE(zone->DeregisterConnLocked(c2));
  EXPECT_FALSE(zone->DeregisterConnLocked(c2));
  EXPECT_FALSE(zone->JoinLocked(c2)) << "a freed slot cannot join";
  EXPECT_EQ(zone->key(k).active.load(), 0u);
  EXPECT_FALSE(zone->DeregisterConnLocked(c1)) << "c1 had left already";
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_FALSE(zone->JoinLocked(zone->conn_capacity()));
  EXPECT_FALSE(zone->LeaveLocked(kNoSlot));
}

TEST_F(ZoneTest, FreedConnectionSlotGetsANewCookie) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t c = RegisterLocked(*zone, 1, 0);
  ASSERT_NE(c, kNoSlot);
  const uint32_t seq = zone->conn(c).seq.load();
  EXPECT_EQ(seq & 1, 1u) << "odd while in use";
  zone->DeregisterConnLocked(c);
  EXPECT_EQ(zone->conn(c).seq.load() & 1, 0u) << "even while free";
  const uint32_t again = RegisterLocked(*zone, 1, 0);
  ASSERT_EQ(again, c) << "the free list is LIFO";
  EXPECT_NE(Zone::CookieOf(zone->conn(again).seq.load()), Zone::CookieOf(seq));
}

TEST_F(ZoneTest, RegisterRefusesIndicesOutOfRange) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t k = zone->FindOrInsertKeyLocked(MakeKey(1).bytes, 1);
  EXPECT_EQ(zone->RegisterConnLocked(zone->key_capacity(), 0, 1, kPeer, 1),
            kNoSlot);
  EXPECT_EQ(zone->RegisterConnLocked(k, zone->proc_capacity(), 1, kPeer, 1),
            kNoSlot);
  EXPECT_EQ(zone->header().conns_used, 0u);
  zone->ReleaseKeyIfUnusedLocked(k);
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ZoneTest, FullKeyTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->key_capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::set<uint32_t> slots;
  for (uint32_t n = 0; n < capacity; ++n) {
    const uint32_t k = zone->FindOrInsertKeyLocked(MakeKey(n).bytes, 1);
    ASSERT_NE(k, kNoSlot) << n;
    slots.insert(k);
  }
  EXPECT_EQ(slots.size(), capacity);
  EXPECT_EQ(zone->header().keys_used, capacity);
  EXPECT_EQ(zone->header().table_full.load(), 0u);
  EXPECT_EQ(zone->FindOrInsertKeyLocked(MakeKey(capacity).bytes, 1), kNoSlot);
  EXPECT_EQ(zone->FindOrInsertKeyLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 2u);
  // Every key is still found; an existing key needs no free slot.
  for (uint32_t n = 0; n < capacity; ++n) {
    ASSERT_NE(zone->FindKeyLocked(MakeKey(n).bytes), kNoSlot) << n;
  }
  EXPECT_NE(zone->FindOrInsertKeyLocked(MakeKey(3).bytes, 1), kNoSlot);
  // Freeing one makes room for exactly one more.
  const uint32_t freed = zone->FindKeyLocked(MakeKey(17).bytes);
  zone->ReleaseKeyIfUnusedLocked(freed);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(17).bytes), kNoSlot);
  EXPECT_EQ(zone->FindOrInsertKeyLocked(MakeKey(capacity).bytes, 1), freed);
  EXPECT_EQ(zone->FindOrInsertKeyLocked(MakeKey(capacity + 1).bytes, 1),
            kNoSlot);
  for (uint32_t n = 0; n <= capacity; ++n) {
    zone->ReleaseKeyIfUnusedLocked(zone->FindKeyLocked(MakeKey(n).bytes));
  }
  EXPECT_EQ(zone->header().keys_used, 0u);
}

TEST_F(ZoneTest, FullConnectionTableReturnsNoSlotAndRecovers) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  const uint32_t capacity = zone->conn_capacity();
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  std::vector<uint32_t> conns;
  for (uint32_t i = 0; i < capacity; ++i) {
    const uint32_t c = RegisterLocked(*zone, i % 3, 0, static_cast<int>(i));
    ASSERT_NE(c, kNoSlot) << i;
    conns.push_back(c);
  }
  EXPECT_EQ(zone->header().conns_used, capacity);
  EXPECT_EQ(zone->proc(0).conns.load(), capacity);
  // Full: a new key is inserted but the connection is refused; the helper
  // then releases the key, as the Governor does.
  EXPECT_EQ(RegisterLocked(*zone, 99, 0), kNoSlot);
  EXPECT_EQ(zone->header().table_full.load(), 1u);
  EXPECT_EQ(zone->FindKeyLocked(MakeKey(99).bytes), kNoSlot);
  EXPECT_EQ(zone->header().keys_used, 3u);
  // After a free, registering works again.
  EXPECT_FALSE(zone->DeregisterConnLocked(conns.back()));
  conns.pop_back();
  const uint32_t c = RegisterLocked(*zone, 99, 0);
  ASSERT_NE(c, kNoSlot);
  conns.push_back(c);
  EXPECT_EQ(RegisterLocked(*zone, 98, 0), kNoSlot);
  for (const uint32_t conn : conns) zone->DeregisterConnLocked(conn);
  EXPECT_EQ(zone->header().conns_used, 0u);
  EXPECT_EQ(zone->header().keys_used, 0u);
  EXPECT_EQ(zone->proc(0).conns.load(), 0u);
}

TEST_F(ZoneTest, CountsFromForkedProcessesAddUp) {
  constexpr int kChildren = 4;
  constexpr int kRounds = 500;
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const TestKey shared = MakeKey(1000);
  Pipe go;
  std::vector<pid_t> children;
  for (int child = 0; child < kChildren; ++child) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      go.CloseWrite();
      // Start together: wait until the parent closes the pipe.
      char c;
      while (read(go.read_end(), &c, 1) < 0 && errno == EINTR) {
      }
      const uint32_t proc = static_cast<uint32_t>(child);
      for (int i = 0; i < kRounds; ++i) {
        {
          // A connection that stays; every other one also stays active.
          ZoneLock lock(*zone);
          TRAFFICRATE_CHILD_CHECK(lock.ok());
          const uint32_t k = zone->FindOrInsertKeyLocked(shared.bytes, 1);
          TRAFFICRATE_CHILD_CHECK(k != kNoSlot);
          const uint32_t c = zone->RegisterConnLocked(k, proc, i, kPeer, 1);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          if (i % 2 == 0) TRAFFICRATE_CHILD_CHECK(zone->JoinLocked(c));
        }
        {
          // A connection with a key of its own that comes and goes.
          ZoneLock lock(*zone);
          TRAFFICRATE_CHILD_CHECK(lock.ok());
          const TestKey own = MakeKey(static_cast<uint32_t>(i), 1 + child);
          const uint32_t k = zone->FindOrInsertKeyLocked(own.bytes, 1);
          TRAFFICRATE_CHILD_CHECK(k != kNoSlot);
          const uint32_t c = zone->RegisterConnLocked(k, proc, -1, kPeer, 2);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          TRAFFICRATE_CHILD_CHECK(zone->JoinLocked(c));
          TRAFFICRATE_CHILD_CHECK(zone->LeaveLocked(c));
          TRAFFICRATE_CHILD_CHECK(!zone->DeregisterConnLocked(c));
        }
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  go.CloseWrite();
  for (const pid_t pid : children) {
    EXPECT_TRUE(ExitedWith(WaitChild(pid), 0)) << "child " << pid;
  }
  ZoneLock lock(*zone);
  ASSERT_TRUE(lock.ok());
  const ZoneHeaderShm& h = zone->header();
  EXPECT_EQ(h.lock_repairs.load(), 0u);
  EXPECT_EQ(h.keys_used, 1u) << "the coming-and-going keys were all freed";
  EXPECT_EQ(h.conns_used, uint32_t{kChildren * kRounds});
  const uint32_t k = zone->FindKeyLocked(shared.bytes);
  ASSERT_NE(k, kNoSlot);
  EXPECT_EQ(zone->key(k).refs, uint32_t{kChildren * kRounds});
  EXPECT_EQ(zone->key(k).active.load(), uint32_t{kChildren * kRounds / 2});
  for (uint32_t p = 0; p < kChildren; ++p) {
    EXPECT_EQ(zone->proc(p).conns.load(), uint32_t{kRounds}) << p;
  }
  for (uint32_t c = 0; c < zone->conn_capacity(); ++c) {
    if (zone->conn(c).seq.load() & 1) zone->DeregisterConnLocked(c);
  }
  EXPECT_EQ(h.conns_used, 0u);
  EXPECT_EQ(h.keys_used, 0u) << "no key leaked";
}

TEST_F(ZoneTest, LockHolderKilledMidUpdateLeavesARepairedTable) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  uint32_t a_conns[3];
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    for (int i = 0; i < 3; ++i) {
      a_conns[i] = RegisterLocked(*zone, 1, 2, 20 + i);
      ASSERT_NE(a_conns[i], kNoSlot);
    }
    zone->JoinLocked(a_conns[0]);
    zone->JoinLocked(a_conns[1]);
  }
  const uint32_t key_a = zone->conn(a_conns[0]).key_index.load();
  Pipe holding;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Dies inside the critical section with the table half-written.
    ZoneLock lock(*zone);
    TRAFFICRATE_CHILD_CHECK(lock.ok());
    const uint32_t b = zone->FindOrInsertKeyLocked(MakeKey(2).bytes, 1);
    TRAFFICRATE_CHILD_CHECK(b != kNoSlot);
    zone->key(key_a).refs = 999;
    zone->key(key_a).active.store(77);
    zone->header().conns_used = 12345;
    zone->header().conn_free_head = kNoSlot;  // as if the list was lost
    zone->proc(2).conns.store(55);
    WriteByte(holding.write_end());
    raise(SIGKILL);
    _exit(1);
  }
  holding.CloseWrite();  // EOF at once if the child dies early
  ASSERT_TRUE(ReadByte(holding.read_end())) << "the child never took the lock";
  const int status = WaitChild(pid);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status) &&
              WTERMSIG(status) == SIGKILL);
  // The kernel released the dead owner's robust lock; locking must not block.
  ASSERT_TRUE(OwnerDied(zone->header().lock));
  const uint64_t repairs = zone->header().lock_repairs.load();
  const uint32_t change = zone->ChangeWord();
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    const ZoneHeaderShm& h = zone->header();
    EXPECT_EQ(h.lock_repairs.load(), repairs + 1);
    EXPECT_EQ(zone->key(key_a).refs, 3u);
    EXPECT_EQ(zone->key(key_a).active.load(), 2u);
    EXPECT_EQ(h.conns_used, 3u);
    EXPECT_EQ(h.keys_used, 1u);
    EXPECT_EQ(zone->proc(2).conns.load(), 3u);
    EXPECT_EQ(zone->FindKeyLocked(MakeKey(1).bytes), key_a);
    EXPECT_EQ(zone->FindKeyLocked(MakeKey(2).bytes), kNoSlot)
        << "a key without connections is dropped";
    // The free lists were rebuilt: every other slot can be used.
    uint32_t registered = 0;
    for (uint32_t n = 10; n < 10 + zone->key_capacity(); ++n) {
      if (RegisterLocked(*zone, n, 0) == kNoSlot) break;
      ++registered;
    }
    EXPECT_EQ(registered, zone->conn_capacity() - 3);
    EXPECT_EQ(h.keys_used, 1 + registered);
    for (uint32_t c = 0; c < zone->conn_capacity(); ++c) {
      if ((zone->conn(c).seq.load() & 1) &&
          zone->conn(c).key_index.load() != key_a) {
        zone->DeregisterConnLocked(c);
      }
    }
    EXPECT_EQ(h.keys_used, 1u);
    EXPECT_EQ(h.conns_used, 3u);
  }
  EXPECT_NE(zone->ChangeWord(), change) << "watchers are told to re-apply";
  EXPECT_FALSE(OwnerDied(zone->header().lock));
  // Later lockers see a plain, consistent lock.
  ZoneLock again(*zone);
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(zone->header().lock_repairs.load(), repairs + 1);
}

TEST_F(ZoneTest, WaitForChangeReturnsAtOnceWhenTheWordAlreadyMoved) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t seen = zone->ChangeWord();
  zone->WakeWatchers();
  EXPECT_NE(zone->ChangeWord(), seen);
  const int64_t start = MonotonicNowNs();
  zone->WaitForChange(seen, 60 * kNsPerSec);
  EXPECT_LT(MonotonicNowNs() - start, kWaitNs);
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ZoneTest, WakeWatchersWakesAWaiterInAnotherProcess) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  constexpr int64_t kLongTimeoutNs = 60 * kNsPerSec;
  const uint32_t seen = zone->ChangeWord();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int64_t start = MonotonicNowNs();
    zone->WaitForChange(seen, kLongTimeoutNs);
    TRAFFICRATE_CHILD_CHECK(zone->ChangeWord() != seen);
    TRAFFICRATE_CHILD_CHECK(MonotonicNowNs() - start < kLongTimeoutNs / 2);
    _exit(0);
  }
  // Wake only once the child is (about to be) blocked in the futex.
  const bool waiting =
      PollUntil([&] { return zone->header().watchers_waiting.load() == 1; });
  const int64_t woken = MonotonicNowNs();
  zone->WakeWatchers();
  const int status = WaitChild(pid, kLongTimeoutNs / 4);
  const int64_t took = MonotonicNowNs() - woken;
  ASSERT_TRUE(waiting) << "the child never waited";
  EXPECT_TRUE(ExitedWith(status, 0)) << status;
  EXPECT_LT(took, kWaitNs) << "the waiter slept on after the wake";
  EXPECT_EQ(zone->header().watchers_waiting.load(), 0u);
}

TEST_F(ZoneTest, SetRateStoresTheRateAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  const uint32_t settings = zone->header().settings_generation.load();
  const uint32_t change = zone->ChangeWord();
  zone->SetRate(5 * kRate);
  EXPECT_EQ(zone->header().rate_bytes_per_sec.load(), 5 * kRate);
  EXPECT_EQ(zone->header().settings_generation.load(), settings + 1);
  EXPECT_NE(zone->ChangeWord(), change);
}

TEST_F(ZoneTest, DeadProcessIsReapedAndALiveOneIsNot) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  // This process: a live slot owning two connections of key 1, one sending.
  uint32_t me = kNoSlot;
  {
    ZoneLock lock(*zone);
    me = zone->ClaimProcLocked(getpid(), 1);
  }
  ASSERT_NE(me, kNoSlot);
  MutexReleaser release_me(&zone->proc(me).liveness);
  {
    ZoneLock lock(*zone);
    const uint32_t c = RegisterLocked(*zone, 1, me, 30);
    ASSERT_NE(c, kNoSlot);
    zone->JoinLocked(c);
    ASSERT_NE(RegisterLocked(*zone, 1, me, 31), kNoSlot);
  }
  // Two children: one will die, one stays alive until told to go.
  Pipe ready;
  Pipe finish;
  pid_t children[2];
  for (int i = 0; i < 2; ++i) {
    children[i] = fork();
    ASSERT_GE(children[i], 0);
    if (children[i] == 0) {
      finish.CloseWrite();
      uint32_t slot = kNoSlot;
      {
        ZoneLock lock(*zone);
        TRAFFICRATE_CHILD_CHECK(lock.ok());
        // The main thread claims and so holds the liveness mutex.
        slot = zone->ClaimProcLocked(getpid(), 1);
        TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
        // Key 1: three connections, two sending; key 2: two connections.
        for (int n = 0; n < 3; ++n) {
          const uint32_t c = RegisterLocked(*zone, 1, slot, 40 + n);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot);
          if (n < 2) TRAFFICRATE_CHILD_CHECK(zone->JoinLocked(c));
        }
        for (int n = 0; n < 2; ++n) {
          TRAFFICRATE_CHILD_CHECK(RegisterLocked(*zone, 2 + i, slot, 50) !=
                                  kNoSlot);
        }
      }
      WriteByte(ready.write_end());
      ReadByte(finish.read_end());  // killed here, or told to finish
      _exit(0);
    }
  }
  finish.CloseRead();
  ready.CloseWrite();
  ASSERT_TRUE(ReadByte(ready.read_end()));
  ASSERT_TRUE(ReadByte(ready.read_end()));
  uint32_t slots[2] = {kNoSlot, kNoSlot};
  for (uint32_t p = 0; p < zone->proc_capacity(); ++p) {
    for (int i = 0; i < 2; ++i) {
      if (zone->proc(p).state.load() == kProcLive &&
          zone->proc(p).pid.load() == children[i]) {
        slots[i] = p;
      }
    }
  }
  ASSERT_NE(slots[0], kNoSlot);
  ASSERT_NE(slots[1], kNoSlot);
  const uint32_t dead = slots[0];
  const uint32_t live = slots[1];
  EXPECT_FALSE(Zone::ProcMaybeDead(zone->proc(dead)));
  EXPECT_FALSE(Zone::ProcMaybeDead(zone->proc(live)));
  EXPECT_FALSE(Zone::ProcMaybeDead(zone->proc(me)));
  {
    ZoneLock lock(*zone);
    EXPECT_EQ(zone->header().conns_used, 2u + 5u + 5u);
    uint32_t reaped = 99;
    EXPECT_FALSE(zone->ReapIfDeadLocked(dead, &reaped)) << "still alive";
    EXPECT_EQ(reaped, 99u);
  }

  ASSERT_EQ(kill(children[0], SIGKILL), 0);
  const int status = WaitChild(children[0]);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status));
  EXPECT_TRUE(Zone::ProcMaybeDead(zone->proc(dead)));
  EXPECT_FALSE(Zone::ProcMaybeDead(zone->proc(live)));
  {
    ZoneLock lock(*zone);
    ASSERT_TRUE(lock.ok());
    const uint32_t key1 = zone->FindKeyLocked(MakeKey(1).bytes);
    ASSERT_NE(key1, kNoSlot);
    EXPECT_EQ(zone->key(key1).refs, 2u + 3u + 3u);
    EXPECT_EQ(zone->key(key1).active.load(), 1u + 2u + 2u);
    const uint32_t gen = zone->key(key1).generation.load();

    EXPECT_FALSE(zone->ReapIfDeadLocked(live, nullptr)) << "a live process";
    EXPECT_FALSE(zone->ReapIfDeadLocked(me, nullptr)) << "the caller itself";
    uint32_t reaped = 0;
    EXPECT_TRUE(zone->ReapIfDeadLocked(dead, &reaped));
    EXPECT_EQ(reaped, 5u);
    EXPECT_FALSE(zone->ReapIfDeadLocked(dead, nullptr)) << "already free";
    EXPECT_FALSE(zone->ReapIfDeadLocked(zone->proc_capacity(), nullptr));

    EXPECT_EQ(zone->key(key1).refs, 2u + 3u);
    EXPECT_EQ(zone->key(key1).active.load(), 1u + 2u);
    EXPECT_NE(zone->key(key1).generation.load(), gen);
    EXPECT_EQ(zone->FindKeyLocked(MakeKey(2).bytes), kNoSlot);
    EXPECT_NE(zone->FindKeyLocked(MakeKey(3).bytes), kNoSlot);
    EXPECT_EQ(zone->header().conns_used, 2u + 5u);
    EXPECT_EQ(zone->header().keys_used, 2u);
    EXPECT_EQ(zone->header().procs_reaped.load(), 1u);
    EXPECT_EQ(zone->header().conns_reaped.load(), 5u);
    EXPECT_EQ(zone->proc(dead).state.load(), kProcFree);
    EXPECT_EQ(zone->proc(live).conns.load(), 5u);
    EXPECT_EQ(zone->proc(me).conns.load(), 2u);
    for (uint32_t c = 0; c < zone->conn_capacity(); ++c) {
      if (zone->conn(c).seq.load() & 1) {
        EXPECT_NE(zone->conn(c).proc_index.load(), dead) << c;
      }
    }
    // The reaped slot's mutex was made consistent: it can be claimed again.
    EXPECT_FALSE(OwnerDied(zone->proc(dead).liveness));
    const uint32_t again = zone->ClaimProcLocked(getpid(), 2);
    ASSERT_NE(again, kNoSlot);
    MutexReleaser release_again(&zone->proc(again).liveness);
    EXPECT_EQ(again, dead) << "the lowest free slot";
  }
  WriteByte(finish.write_end());
  EXPECT_TRUE(ExitedWith(WaitChild(children[1]), 0));
}

TEST_F(ZoneTest, ReapDeadReleasesEveryDeadProcessAndWakesWatchers) {
  std::unique_ptr<Zone> zone = Open();
  ASSERT_NE(zone, nullptr);
  uint32_t me = kNoSlot;
  {
    ZoneLock lock(*zone);
    me = zone->ClaimProcLocked(getpid(), 1);
  }
  ASSERT_NE(me, kNoSlot);
  MutexReleaser release_me(&zone->proc(me).liveness);
  {
    ZoneLock lock(*zone);
    ASSERT_NE(RegisterLocked(*zone, 1, me), kNoSlot);
  }
  constexpr int kDying = 2;
  Pipe ready;
  pid_t children[kDying];
  for (int i = 0; i < kDying; ++i) {
    children[i] = fork();
    ASSERT_GE(children[i], 0);
    if (children[i] == 0) {
      {
        ZoneLock lock(*zone);
        const uint32_t slot = zone->ClaimProcLocked(getpid(), 1);
        TRAFFICRATE_CHILD_CHECK(slot != kNoSlot);
        for (int n = 0; n < 3; ++n) {
          const uint32_t c = RegisterLocked(*zone, 1, slot);
          TRAFFICRATE_CHILD_CHECK(c != kNoSlot && zone->JoinLocked(c));
        }
      }
      WriteByte(ready.write_end());
      _exit(0);  // dies holding its liveness mutex
    }
  }
  ready.CloseWrite();
  for (int i = 0; i < kDying; ++i) {
    ASSERT_TRUE(ReadByte(ready.read_end()));
    EXPECT_TRUE(ExitedWith(WaitChild(children[i]), 0));
  }
  EXPECT_EQ(zone->header().conns_used, 1u + 3u * kDying);
  const uint32_t change = zone->ChangeWord();
  uint32_t procs = 0;
  EXPECT_EQ(zone->ReapDead(&procs), 3u * kDying);
  EXPECT_EQ(procs, uint32_t{kDying});
  EXPECT_NE(zone->ChangeWord(), change);
  ZoneLock lock(*zone);
  EXPECT_EQ(zone->header().conns_used, 1u);
  const uint32_t key = zone->FindKeyLocked(MakeKey(1).bytes);
  ASSERT_NE(key, kNoSlot);
  EXPECT_EQ(zone->key(key).refs, 1u);
  EXPECT_EQ(zone->key(key).active.load(), 0u);
  EXPECT_EQ(zone->proc(me).state.load(), kProcLive) << "the live one stays";
  EXPECT_EQ(zone->proc(me).conns.load(), 1u);
}

TEST_F(ZoneTest, ProcSlotsAreClaimedOncePerLivenessMutex) {
  std::unique_ptr<Zone> zone = Open(kMinZoneSize);
  ASSERT_NE(zone, nullptr);
  ZoneLock lock(*zone);
  const uint32_t a = zone->ClaimProcLocked(111, 5);
  ASSERT_NE(a, kNoSlot);
  MutexReleaser release_a(&zone->proc(a).liveness);
  const uint32_t b = zone->ClaimProcLocked(222, 6);
  ASSERT_NE(b, kNoSlot);
  MutexReleaser release_b(&zone->proc(b).liveness);
  EXPECT_NE(a, b);
  EXPECT_EQ(zone->proc(a).pid.load(), 111);
  EXPECT_EQ(zone->proc(b).pid.load(), 222);
  EXPECT_EQ(zone->proc(a).state.load(), kProcLive);
  EXPECT_EQ(zone->proc(b).started_ns, 6);
}

}  // namespace
}  // namespace trafficrate
