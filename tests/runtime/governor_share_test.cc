// The Governor on real TCP sockets over loopback and a real zone, without
// LD_PRELOAD (the test plays the interposers; the Governor is driven, see
// governor_fixture.h).
//
// This file: a connection joins its key at its first send and is paced at
// its share; the shares per key (per client address, or one key for all);
// the packet shaper's shape; and how a join, a close or a rate change
// reaches the siblings that send nothing: the watcher's pass over the
// changed shares (ApplyChangedShares), which the test calls.

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

#include "gtest/gtest.h"
#include "src/budget/shaper.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"
#include "tests/runtime/governor_fixture.h"

namespace trafficrate {
namespace {

using testing_util::Conn;
using testing_util::kLongIdleNs;
using testing_util::kRate;
using testing_util::Pacing;

using GovernorShareTest = testing_util::GovernorFixture;

TEST_F(GovernorShareTest, FirstSendJoinsAndAppliesTheWholeRate) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  const uint32_t generation =
      zone_->keys().slot(KeyIndex(c.server)).generation.load();
  EXPECT_EQ(Send(c.server, 1000), 1000);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).active.load(), 1u);
  EXPECT_NE(zone_->keys().slot(KeyIndex(c.server)).generation.load(),
            generation);
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(ConnOf(c.server).share_bytes_per_sec.load(), kRate);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1000u);
  // Further sends change nothing but the byte count.
  EXPECT_EQ(Send(c.server, 500), 500);
  EXPECT_EQ(Active(c.server), 1u);
  EXPECT_EQ(Refs(c.server), 1u);
  EXPECT_EQ(ConnOf(c.server).bytes_sent.load(), 1500u);
}

TEST_F(GovernorShareTest, BeforeSendGivesTheShaperItsShape) {
  StartGovernor();
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  // A fresh connection at a low level: pieces for its level, its first
  // pieces still to go, its MSS read once.
  const Shape shape = gov_->BeforeSend(c.server);
  ASSERT_LT(kRate, kShapeBelowBytesPerSec);
  EXPECT_EQ(
      shape.piece,
      PieceBytes(
          kRate,
          VaryIndex(
              FdState::From(table_->Get(c.server)->state.load()).conn())));
  EXPECT_EQ(shape.first_left, kFirstPieces);
  EXPECT_GT(shape.mss, 0u);
  gov_->UsedFirstPieces(c.server, 4);
  EXPECT_EQ(gov_->BeforeSend(c.server).first_left, kFirstPieces - 4);
  gov_->UsedFirstPieces(c.server, 100);
  EXPECT_EQ(gov_->BeforeSend(c.server).first_left, 0u);
  // A second connection halves the level: the piece follows the pacing.
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  const Shape half = gov_->BeforeSend(c2.server);
  EXPECT_EQ(
      half.piece,
      PieceBytes(
          kRate / 2,
          VaryIndex(
              FdState::From(table_->Get(c2.server)->state.load()).conn())));
}

TEST_F(GovernorShareTest, ShaperOffGivesNoShape) {
  GovernorOptions options;
  options.idle_ns = kLongIdleNs;
  options.shape = false;
  StartGovernor(options);
  const Conn c = Open();
  ASSERT_GE(c.server, 0);
  EXPECT_FALSE(gov_->BeforeSend(c.server).Active());
  EXPECT_EQ(Pacing(c.server), kRate);
  EXPECT_EQ(gov_->copy_buffers(), nullptr);
}

TEST_F(GovernorShareTest, SecondConnectionFromTheSameAddressHalvesBoth) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  EXPECT_EQ(Pacing(c1.server), kRate);
  gov_->BeforeSend(c2.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(KeyIndex(c1.server), KeyIndex(c2.server));
  EXPECT_EQ(Refs(c1.server), 2u);
  EXPECT_EQ(Active(c1.server), 2u);
  EXPECT_EQ(Pacing(c2.server), kRate / 2) << "applied by the joiner";
  // c1 sends nothing more: the watcher's pass pushes its new share.
  EXPECT_EQ(Pacing(c1.server), kRate) << "the joiner left its sibling alone";
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(c1.server), kRate / 2);
  EXPECT_EQ(ConnOf(c1.server).share_bytes_per_sec.load(), kRate / 2);
}

TEST_F(GovernorShareTest, DifferentClientAddressesGetSeparateKeys) {
  StartGovernor();
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 2u);
  EXPECT_NE(KeyIndex(a.server), KeyIndex(b.server));
  EXPECT_EQ(Active(a.server), 1u);
  EXPECT_EQ(Active(b.server), 1u);
  EXPECT_EQ(Pacing(a.server), kRate);
  EXPECT_EQ(Pacing(b.server), kRate);
  // A second connection from .2 halves .2 only.
  const Conn a2 = Open("127.0.0.2");
  gov_->BeforeSend(a2.server);
  EXPECT_EQ(Pacing(a2.server), kRate / 2);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(a.server), kRate / 2);
  EXPECT_EQ(Pacing(b.server), kRate);
  EXPECT_EQ(KeysUsed(), 2u);
}

TEST_F(GovernorShareTest, KeyModeAllPutsEveryClientInOneKey) {
  StartGovernor(kLongIdleNs, KeyMode::kAll);
  const Conn a = Open("127.0.0.2");
  const Conn b = Open("127.0.0.3");
  ASSERT_GE(b.server, 0);
  gov_->BeforeSend(a.server);
  gov_->BeforeSend(b.server);
  EXPECT_EQ(KeysUsed(), 1u);
  EXPECT_EQ(Active(a.server), 2u);
  EXPECT_EQ(Pacing(b.server), kRate / 2);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(a.server), kRate / 2);
}

TEST_F(GovernorShareTest, ClosingOneConnectionGivesTheSiblingTheWholeRate) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  ASSERT_GE(c2.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(c1.server), kRate / 2);
  const uint32_t key = KeyIndex(c1.server);
  CloseKept(c2.server);
  EXPECT_EQ(ConnsUsed(), 1u);
  EXPECT_EQ(zone_->keys().slot(key).active.load(), 1u);
  EXPECT_EQ(Refs(c1.server), 1u);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(c1.server), kRate);
  CloseKept(c1.server);
  EXPECT_EQ(ConnsUsed(), 0u);
  EXPECT_EQ(KeysUsed(), 0u);
}

TEST_F(GovernorShareTest, RateChangeReachesSocketsThroughTheWatcher) {
  StartGovernor();
  const Conn c1 = Open();
  const Conn c2 = Open();
  const Conn other = Open("127.0.0.2");
  ASSERT_GE(other.server, 0);
  gov_->BeforeSend(c1.server);
  gov_->BeforeSend(c2.server);
  gov_->BeforeSend(other.server);
  gov_->ApplyChangedShares();
  ASSERT_EQ(Pacing(c1.server), kRate / 2);
  zone_->settings().SetRate(3 * kRate);
  gov_->ApplyChangedShares();
  EXPECT_EQ(Pacing(c1.server), 3 * kRate / 2);
  EXPECT_EQ(Pacing(c2.server), 3 * kRate / 2);
  EXPECT_EQ(Pacing(other.server), 3 * kRate);
}

}  // namespace
}  // namespace trafficrate
