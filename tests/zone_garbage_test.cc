// Issue 8's rule: no value in the zone can make the library touch memory
// outside the mapping, loop without bound or run into undefined behaviour.
// The Governor runs on real sockets (as in governor_test.cc) while the
// zone's key and connection tables are overwritten with random bytes, and
// every path that reads them runs: sends, the watcher's duties, accepts,
// closes, a snapshot. The sanitizer build (scripts/test.sh) turns any
// stray access or undefined operation into a failure.

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "src/clock.h"
#include "src/governor.h"
#include "src/snapshot.h"
#include "src/zone.h"
#include "src/zone_layout.h"
#include "tests/test_util.h"

namespace trafficrate {
namespace {

using testing_util::Conn;

// Overwrites `count` random bytes of the key and connection tables (not the
// header, whose checks are issue 8's other half, nor the process slots,
// whose robust mutexes belong to the C library).
void Scribble(Zone& zone, std::mt19937_64& rng, int count) {
  auto* keys = reinterpret_cast<uint8_t*>(&zone.key(0));
  auto* conns = reinterpret_cast<uint8_t*>(&zone.conn(0));
  const size_t key_bytes = sizeof(KeySlotShm) * zone.key_capacity();
  const size_t conn_bytes = sizeof(ConnSlotShm) * zone.conn_capacity();
  for (int i = 0; i < count; ++i) {
    // Mostly the first slots, which the connections below use.
    const bool key = rng() % 2 == 0;
    const size_t span =
        rng() % 4 == 0 ? (key ? key_bytes : conn_bytes)
                       : 8 * (key ? sizeof(KeySlotShm) : sizeof(ConnSlotShm));
    uint8_t* base = key ? keys : conns;
    const uint8_t value = rng() % 3 == 0 ? 0xff : static_cast<uint8_t>(rng());
    __atomic_store_n(&base[rng() % span], value, __ATOMIC_RELAXED);
  }
  // The process slots' plain fields (not their mutexes): a state, a pid, a
  // count.
  ProcSlotShm& proc = zone.proc(rng() % zone.proc_capacity());
  switch (rng() % 4) {
    case 0:
      proc.state.store(static_cast<uint32_t>(rng() % 4),
                       std::memory_order_relaxed);
      break;
    case 1:
      proc.pid.store(static_cast<int32_t>(rng()), std::memory_order_relaxed);
      break;
    case 2:
      proc.conns.store(static_cast<uint32_t>(rng()), std::memory_order_relaxed);
      break;
    default:
      break;
  }
}

class ZoneGarbageSeeds : public testing_util::GovernorFixture,
                         public testing::WithParamInterface<uint64_t> {};

TEST_P(ZoneGarbageSeeds, RandomTablesNeverCrashOrHang) {
  StartGovernor(/*idle_ns=*/50 * kNsPerMs);
  zone_->SetShare(ShareMode::kBudget, 0);
  std::vector<Conn> conns;
  for (int i = 0; i < 6; ++i) {
    conns.push_back(Open(i % 2 == 0 ? "127.0.0.2" : "127.0.0.3"));
    ASSERT_GE(conns.back().server, 0);
  }
  std::vector<char> buf(4096, 'x');
  std::mt19937_64 rng(GetParam());
  const int64_t start = MonotonicNowNs();
  for (int round = 0; round < 500; ++round) {
    Scribble(*zone_, rng, 1 + static_cast<int>(rng() % 64));
    for (Conn& c : conns) {
      if (c.server < 0) continue;
      gov_->BeforeSend(c.server);
      const ssize_t sent = ::send(c.server, buf.data(), 1 + rng() % buf.size(),
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
      gov_->AfterSend(c.server, sent);
      char sink[8192];
      while (::recv(c.client, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
    }
    const int64_t now = start + round * 7 * kNsPerMs;
    gov_->TickBudget(now);
    gov_->ApplyChangedShares();
    gov_->ExpireIdle(now);
    gov_->ReapDead();
    EXPECT_TRUE(TakeSnapshot(*zone_).ok());
    if (round % 25 == 24) {
      // A close and a new connection now and then.
      Conn& old = conns[rng() % conns.size()];
      Close(old);
      old = Connect("127.0.0.4");
      ASSERT_GE(old.server, 0);
    }
  }
  for (Conn& c : conns) Close(c);
  // Bounded: the whole run takes well under the test's timeout.
  EXPECT_LT(MonotonicNowNs() - start, 60 * kNsPerSec);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ZoneGarbageSeeds,
                         testing::Values(1, 2, 3, 20261202, 0xdeadbeef));

}  // namespace
}  // namespace trafficrate
