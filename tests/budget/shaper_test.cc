#include "src/budget/shaper.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::Each;
using ::testing::Eq;

std::vector<size_t> Pieces(const Shape& shape, size_t total) {
  PieceCursor cursor(shape, total);
  std::vector<size_t> pieces;
  while (size_t piece = cursor.Next()) pieces.push_back(piece);
  return pieces;
}

// A connection's shape on an Ethernet path (MSS 1448).
Shape ShapeOf(uint32_t piece, uint32_t first_left = 0) {
  Shape shape;
  shape.piece = piece;
  shape.mss = 1448;
  shape.first_left = first_left;
  return shape;
}

size_t Sum(const std::vector<size_t>& pieces) {
  size_t sum = 0;
  for (size_t p : pieces) sum += p;
  return sum;
}

TEST(PieceBytesTest, AboutFortyPiecesASecondVariedPerConnection) {
  const uint64_t level = 64000;
  EXPECT_EQ(PieceBytes(level, 0), level / 56);
  EXPECT_NEAR(PieceBytes(level, kVarySteps - 1), level / 28.0, 20);
  for (uint32_t vary = 0; vary < kVarySteps; ++vary) {
    const double per_second = double(level) / PieceBytes(level, vary);
    EXPECT_GE(per_second, 28.0);
    EXPECT_LE(per_second, 56.1);  // integer bytes
  }
}

TEST(PieceBytesTest, BoundsAndUnshapedLevels) {
  EXPECT_EQ(PieceBytes(0, 5), 0u);  // not paced
  EXPECT_EQ(PieceBytes(kShapeBelowBytesPerSec, 0), 0u);
  EXPECT_EQ(PieceBytes(~uint64_t{0}, 0), 0u);
  EXPECT_EQ(PieceBytes(1000, 0), kMinPieceBytes);  // 4 a second at most
  EXPECT_EQ(PieceBytes(1, 63), kMinPieceBytes);
  EXPECT_LE(PieceBytes(kShapeBelowBytesPerSec - 1, kVarySteps - 1),
            kMaxPieceBytes);
  EXPECT_EQ(PieceBytes(1000, 1000), PieceBytes(1000, kVarySteps - 1));
}

TEST(PieceBytesTest, AKeyOfManyConnectionsSendsAboutAThousandPiecesASecond) {
  // 1 000 connections of a 10 MB/s key, 10 KB/s each: pieces of about
  // 10 KB, not 250 B (40 a second each, 40 000 for the key).
  const uint64_t key_rate = 10'000'000, level = key_rate / 1000;
  double per_second = 0;
  for (uint32_t vary = 0; vary < kVarySteps; ++vary) {
    const uint32_t piece = PieceBytes(level, vary, key_rate);
    EXPECT_GE(piece, key_rate / 1400) << vary;
    EXPECT_LE(piece, key_rate / 700 + 1) << vary;
    per_second += 1000.0 * level / piece / kVarySteps;  // the key's, on average
  }
  EXPECT_GT(per_second, 700);
  EXPECT_LT(per_second, 1400);
  // Few connections: level / 40 is larger and wins.
  EXPECT_EQ(PieceBytes(64000, 0, 64000), PieceBytes(64000, 0));
  EXPECT_EQ(PieceBytes(512000 / 64, 0, 512000), 512000 / 1400);
  // Any key rate: at most kMaxPieceBytes, no overflow; still 0 when the
  // level is left to the kernel.
  EXPECT_EQ(PieceBytes(1000, 7, ~uint64_t{0}), kMaxPieceBytes);
  EXPECT_EQ(PieceBytes(1000, 7, uint64_t{1} << 50), kMaxPieceBytes);
  EXPECT_EQ(PieceBytes(kShapeBelowBytesPerSec, 7, ~uint64_t{0}), 0u);
  EXPECT_EQ(PieceBytes(1000, 7, 0), kMinPieceBytes);
}

TEST(VaryIndexTest, NeighbouringSlotsGetDifferentSizes) {
  std::set<uint32_t> seen;
  for (uint32_t conn = 0; conn < 16; ++conn) {
    EXPECT_LT(VaryIndex(conn), kVarySteps);
    seen.insert(VaryIndex(conn));
  }
  EXPECT_GE(seen.size(), 14u);
}

TEST(PieceCursorTest, AnEmptyCallIsNeverCut) {
  PieceCursor cursor(ShapeOf(5000, kFirstPieces), 0);
  EXPECT_FALSE(cursor.Cut());
  EXPECT_EQ(cursor.Next(), 0u);
}

TEST(PieceCursorTest, UnshapedCallGoesWhole) {
  const Shape none;
  PieceCursor cursor(none, 100000);
  EXPECT_FALSE(cursor.Cut());
  EXPECT_EQ(cursor.Next(), 100000u);
  EXPECT_EQ(cursor.Next(), 0u);
}

TEST(PieceCursorTest, LevelPiecesCoverTheCallAndNeverEndInASmallTail) {
  const Shape shape = ShapeOf(5000);
  for (size_t total :
       {1u, 1447u, 5000u, 5001u, 6447u, 6448u, 6449u, 20000u, 123457u}) {
    const std::vector<size_t> pieces = Pieces(shape, total);
    EXPECT_EQ(Sum(pieces), total) << total;
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      EXPECT_EQ(pieces[i], 5000u) << total;
    }
    if (total >= shape.mss) {
      EXPECT_GE(pieces.back(), shape.mss) << total;
    }
    EXPECT_LT(pieces.back(), 5000u + shape.mss) << total;
  }
}

TEST(PieceCursorTest, PiecesBelowOneMssKeepTheirSize) {
  // A level so low that its piece is under one MSS: every piece but the
  // last is that size (taking a tail along would make a piece up to six
  // times larger).
  const std::vector<size_t> pieces = Pieces(ShapeOf(256), 1000);
  EXPECT_EQ(pieces, (std::vector<size_t>{256, 256, 256, 232}));
}

TEST(PieceCursorTest, FirstPiecesAreTinyThenTheLevelsPieces) {
  PieceCursor cursor(ShapeOf(3000, kFirstPieces), 20000);
  std::vector<size_t> pieces;
  while (size_t piece = cursor.Next()) pieces.push_back(piece);
  EXPECT_EQ(cursor.first_used(), kFirstPieces);
  ASSERT_GT(pieces.size(), kFirstPieces);
  EXPECT_THAT(
      std::vector<size_t>(pieces.begin(), pieces.begin() + kFirstPieces),
      Each(Eq(kFirstPieceBytes)));
  EXPECT_EQ(pieces[kFirstPieces], 3000u);
  EXPECT_EQ(Sum(pieces), 20000u);
}

TEST(PieceCursorTest, FirstPiecesOfAFastConnectionThenTheRestWhole) {
  // Six went already.
  const std::vector<size_t> pieces = Pieces(ShapeOf(0, 4), 100000);
  EXPECT_EQ(pieces, (std::vector<size_t>{100, 100, 100, 100, 99600}));
}

TEST(PieceCursorTest, ShortResponseIsNotCutIntoFirstPieces) {
  // What would follow ten first pieces is under one MSS: Nagle could hold
  // that tail a round trip. The response goes as the host wrote it.
  const Shape shape = ShapeOf(0, kFirstPieces);
  for (size_t total : {1u, 300u, 1200u, 2448u}) {
    PieceCursor cursor(shape, total);
    EXPECT_FALSE(cursor.Cut()) << total;
    EXPECT_EQ(cursor.Next(), total);
    EXPECT_EQ(cursor.first_used(), 0u);
  }
  EXPECT_TRUE(PieceCursor(shape, 2449).Cut());
}

TEST(PieceCursorTest, MaxLimitsAPieceAndCopiesReplay) {
  PieceCursor cursor(ShapeOf(4000), 10000);
  const PieceCursor before = cursor;
  EXPECT_EQ(cursor.Next(1500), 1500u);
  EXPECT_EQ(cursor.left(), 8500u);
  PieceCursor replay = before;
  EXPECT_EQ(replay.Next(1500), 1500u);
  EXPECT_EQ(replay.left(), cursor.left());
  EXPECT_EQ(cursor.Next(0), 0u);
}

TEST(FirstPiecesPayTest, OnlyWhereTheRateDoesNotAllowTheUnpacedStart) {
  // Loopback and LAN: a round trip of tens of microseconds.
  EXPECT_TRUE(FirstPiecesPay(5'000'000, 1448, 50));
  EXPECT_TRUE(FirstPiecesPay(66'000, 65483, 20));
  // 40 ms: 10 segments of 1448 B are the rate's at 362 KB/s and above.
  EXPECT_TRUE(FirstPiecesPay(300'000, 1448, 40'000));
  EXPECT_FALSE(FirstPiecesPay(400'000, 1448, 40'000));
  EXPECT_FALSE(FirstPiecesPay(100'000'000, 1448, 1'000));
  // Unpaced (budget mode under the rate), or no round trip measured.
  EXPECT_FALSE(FirstPiecesPay(~uint64_t{0}, 1448, 30));
  EXPECT_TRUE(FirstPiecesPay(64'000, 1448, 0));
}

TEST(ChunkBytesTest, AQuarterSecondAtLeast256KiB) {
  EXPECT_EQ(ChunkBytes(0), 0u);
  EXPECT_EQ(ChunkBytes(~uint64_t{0}), 0u);
  EXPECT_EQ(ChunkBytes(100'000), 256u << 10);
  EXPECT_EQ(ChunkBytes(40'000'000), 10'000'000u);
}

TEST(SegmentsOfTest, CountsSegmentsUpToTheFirstPieces) {
  EXPECT_EQ(SegmentsOf(0, 1448), 0u);
  EXPECT_EQ(SegmentsOf(1, 1448), 1u);
  EXPECT_EQ(SegmentsOf(1449, 1448), 2u);
  EXPECT_EQ(SegmentsOf(1 << 20, 1448), kFirstPieces);
  EXPECT_EQ(SegmentsOf(2000, 0), 2u);
}

// A simulation of what the shaper is for: N connections of one key, each
// paced by the kernel at level = rate / N, with the server topping up every
// socket at the same instants (an event loop woken by the same ticks). The
// kernel sends a packet when its departure time comes; a packet is at most
// one piece (MSG_EOR), or, unshaped, whatever the socket holds up to the
// 64 KiB size goal; the next departure is len / level later. The key's
// total is counted in 1 s windows.
struct Windows {
  double min = 1e9;
  double max = 0;
};

Windows Simulate(int conns, uint64_t rate, bool shaped) {
  const uint64_t level = rate / conns;
  const int64_t kTickNs = 1'000'000;  // 1 ms
  const int64_t kEndNs = 12'000'000'000;
  struct Conn {
    int64_t next_ns = 0;
    uint32_t piece = 0;
  };
  std::vector<Conn> c(conns);
  for (int i = 0; i < conns; ++i) {
    c[i].piece = shaped ? PieceBytes(level, VaryIndex(i)) : kMaxPieceBytes;
    // Within a few milliseconds of each other, as one client's downloads
    // start.
    c[i].next_ns = i * 3'000'000 % 50'000'000;
  }
  std::vector<double> window(12, 0.0);
  for (int64_t now = 0; now < kEndNs; now += kTickNs) {
    for (Conn& conn : c) {
      // Bounded: each pass moves next_ns forward.
      while (conn.next_ns <= now) {
        const uint32_t len = conn.piece;
        window[now / 1'000'000'000] += len;
        conn.next_ns += static_cast<int64_t>(len * 1e9 / level);
      }
    }
  }
  Windows w;
  for (size_t i = 2; i < window.size(); ++i) {
    w.min = std::min(w.min, window[i] / rate);
    w.max = std::max(w.max, window[i] / rate);
  }
  return w;
}

TEST(ShaperSimulationTest, PiecesHoldEverySecondWhereLargePacketsSwing) {
  for (int conns : {4, 16, 64}) {
    const Windows plain = Simulate(conns, 512000, /*shaped=*/false);
    const Windows shaped = Simulate(conns, 512000, /*shaped=*/true);
    SCOPED_TRACE(conns);
    if (conns >= 16) {
      // 64 KiB packets at 32 or 8 KB/s: seconds without a packet.
      EXPECT_GT(plain.max - plain.min, 0.3);
    }
    EXPECT_GE(shaped.min, 0.97);
    EXPECT_LE(shaped.max, 1.03);
  }
  // 8 connections at 4 KB/s each: the smallest pieces.
  const Windows slow = Simulate(8, 32000, /*shaped=*/true);
  EXPECT_GE(slow.min, 0.92);
  EXPECT_LE(slow.max, 1.08);
}

}  // namespace
}  // namespace trafficrate
