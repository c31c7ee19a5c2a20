// The fixtures of the zone tests (tests/shm/): a zone of a unique name,
// unlinked in TearDown, distinct keys, the locked steps most tests take, and
// a child process that holds the zone lock.

#ifndef TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_
#define TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "src/shm/zone.h"
#include "src/shm/zone_layout.h"
#include "src/shm/zone_segment.h"
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

// --- The tests of the zone and its parts.

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

// Fixture of the tests of the zone and its parts: a zone of its own, opened
// on demand (as a Zone, or as its ZoneSegment alone).
class ZoneFixture : public ZoneNameFixture {
 protected:
  template <typename Handle = Zone>
  std::unique_ptr<Handle> Open(uint64_t size = kOneMiB, uint64_t rate = kRate) {
    absl::StatusOr<std::unique_ptr<Handle>> zone =
        Handle::OpenOrCreate(zone_name_, size, rate);
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
  // The same, taking the zone lock for it.
  static uint32_t Register(Zone& zone, uint32_t n, uint32_t proc, int fd = 7) {
    ZoneLock lock(zone);
    return lock.ok() ? RegisterLocked(zone, n, proc, fd) : kNoSlot;
  }
  // N connections of key n, the i-th owned by process slot i, with fd
  // 10 + i.
  template <size_t N>
  static std::array<uint32_t, N> RegisterEachLocked(Zone& zone, uint32_t n) {
    std::array<uint32_t, N> conns;
    for (size_t i = 0; i < N; ++i) {
      conns[i] = RegisterLocked(zone, n, static_cast<uint32_t>(i),
                                10 + static_cast<int>(i));
    }
    return conns;
  }

  // This process's slot in the process table for a scope (kNoSlot if none
  // was free): the calling thread holds its liveness mutex, and lets it go
  // at the end of the scope, before the zone is unmapped.
  class OwnProc {
   public:
    explicit OwnProc(Zone& zone)
        : slot_(ClaimProc(zone)),
          release_(slot_ != kNoSlot ? &zone.procs().slot(slot_).liveness
                                    : nullptr) {}
    uint32_t slot() const { return slot_; }

   private:
    const uint32_t slot_;
    MutexReleaser release_;
  };
};

// A child process that holds the zone lock until told to let go.
class LockHolder {
 public:
  explicit LockHolder(Zone& zone) {
    pid_ = fork();
    if (pid_ == 0) {
      ready_.CloseRead();
      release_.CloseWrite();
      {
        ZoneLock lock(zone, kWatcherLockWaitNs);
        TRAFFICRATE_CHILD_CHECK(lock.ok());
        TRAFFICRATE_CHILD_CHECK(WriteByte(ready_.write_end()));
        ReadByte(release_.read_end());
      }
      _exit(0);
    }
    ready_.CloseWrite();
    release_.CloseRead();
    holding_ = pid_ > 0 && ReadByte(ready_.read_end());
  }
  ~LockHolder() {
    if (pid_ > 0) Kill();
  }

  bool holding() const { return holding_; }
  pid_t pid() const { return pid_; }

  // SIGSTOP, and waits until it is stopped.
  bool Stop() {
    if (kill(pid_, SIGSTOP) != 0) return false;
    int status = 0;
    return waitpid(pid_, &status, WUNTRACED) == pid_ && WIFSTOPPED(status);
  }
  // Resumes it and lets it unlock and exit.
  bool Release() {
    kill(pid_, SIGCONT);
    WriteByte(release_.write_end());
    const int status = WaitChild(pid_);
    pid_ = -1;
    return ExitedWith(status, 0);
  }
  // Dies holding the lock (stopped or not).
  void Kill() {
    kill(pid_, SIGKILL);
    WaitChild(pid_);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool holding_ = false;
  Pipe ready_;
  Pipe release_;
};

// Sanitizers slow everything down: a bound on the time the lock tests'
// waits may take beyond their limits, not a target.
inline constexpr int64_t kLockSlackNs = (kUnderTsan ? 200 : 50) * kNsPerMs;

inline int64_t ElapsedNs(int64_t since) { return MonotonicNowNs() - since; }

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_SHM_ZONE_FIXTURE_H_
