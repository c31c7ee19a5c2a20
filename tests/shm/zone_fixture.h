// The fixtures of the zone tests (tests/shm/): a zone of a unique name,
// unlinked in TearDown, distinct keys, and the locked steps most tests take.

#ifndef TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_
#define TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace testing_util {

// Base fixture for tests of a shm zone: a unique name, unlinked in TearDown.
class ZoneNameFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    zone_name_ = UniqueZoneName();
    (void)ZoneSegment::Unlink(zone_name_);  // a leftover of a crashed run
  }
  void TearDown() override { (void)ZoneSegment::Unlink(zone_name_); }

  std::string zone_name_;
};

// --- The zone tests (zone_test.cc, zone_recovery_test.cc).

inline constexpr uint64_t kOneMiB = uint64_t{1} << 20;
inline constexpr uint64_t kRate = 1'000'000;  // bytes/s

// Distinct 20-byte keys: n in the first four bytes, tag in the fifth.
struct TestKey {
  uint8_t bytes[kKeyBytes] = {};
};
inline TestKey MakeKey(uint32_t n, uint8_t tag = 0) {
  TestKey k;
  std::memcpy(k.bytes, &n, sizeof(n));
  k.bytes[4] = tag;
  k.bytes[19] = 0x5a;
  return k;
}

inline constexpr uint8_t kPeer[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                      0, 0, 0xff, 0xff, 127, 0, 0, 1};

// Fixture of the zone tests (zone_test.cc, zone_recovery_test.cc): a zone of
// its own, opened on demand.
class ZoneFixture : public ZoneNameFixture {
 protected:
  std::unique_ptr<Zone> Open(uint64_t size = kOneMiB, uint64_t rate = kRate) {
    absl::StatusOr<std::unique_ptr<Zone>> zone =
        Zone::OpenOrCreate(zone_name_, size, rate);
    EXPECT_TRUE(zone.ok()) << zone.status();
    return zone.ok() ? std::move(*zone) : nullptr;
  }

  // Claims a process slot for this process (its liveness mutex is then held
  // by the calling thread); kNoSlot if none is free.
  static uint32_t ClaimProc(Zone& zone) {
    ZoneLock lock(zone);
    return lock.ok() ? zone.procs().ClaimLocked(getpid(), 1) : kNoSlot;
  }

  // Registers a connection for key n, owned by proc; returns its slot.
  static uint32_t RegisterLocked(Zone& zone, uint32_t n, uint32_t proc,
                                 int fd = 7) {
    const TestKey key = MakeKey(n);
    const uint32_t k = zone.keys().FindOrInsertLocked(key.bytes, 1);
    if (k == kNoSlot) return kNoSlot;
    const uint32_t c = zone.conns().RegisterLocked(k, proc, fd, kPeer, 4242);
    if (c == kNoSlot) zone.keys().ReleaseIfUnusedLocked(k);
    return c;
  }
};

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_
