// The packet shaper: how a governed connection's bytes are handed to the
// kernel so that its pacing holds in every second (docs/design.md,
// "Packet granularity").
//
// The kernel paces whole packets, and on a low-latency path it grows a
// socket's unsent tail into packets of up to 64 KiB (the TSO size goal at
// tcp_tso_rtt_log=9), or of one 64 KiB MSS on a loopback left at its
// default MTU. A connection paced at 32 KB/s then sends two packets a
// second, and the connections of one key, written by the server at the same
// moments, leave in lock-step: 1 s windows of the key's total swing by
// 30-100%. Two levers fix it, with nothing changed in what a call returns:
//   * each piece sent with MSG_EOR is never appended to, so it leaves as at
//     most one packet of its own size: pieces of about level / 40 give about
//     40 packets a second at any level;
//   * pieces of a slightly different size on each connection of a key put
//     their departures out of phase, so that the key's total is smooth.
// And the kernel sends a connection's first 10 segments unpaced, counting
// segments, not bytes: ten tiny first pieces make that burst about 1 KB
// instead of 10 MSS (640 KiB on a 64 KiB-MTU loopback).
//
// This unit is the plain decision: PieceBytes() gives a connection's piece
// size from its level (the Governor keeps it in the connection's Shape with
// its MSS and first pieces, Governor::BeforeSend); PieceCursor cuts one
// call's bytes into pieces. shaped_send.h makes the system calls.
//
//   shape.piece = PieceBytes(level, VaryIndex(conn_index), key_rate);
//   PieceCursor cursor(shape, call_bytes);
//   while (size_t piece = cursor.Next()) { ... send piece bytes ... }
//
// Everything here is hot path: no allocation, no system call.

#ifndef TRAFFICRATE_SRC_BUDGET_SHAPER_H_
#define TRAFFICRATE_SRC_BUDGET_SHAPER_H_

#include <cstddef>
#include <cstdint>

namespace trafficrate {

// The kernel's largest packet (GSO): pieces are never larger.
inline constexpr uint32_t kMaxPieceBytes = 65536;
// Packets a second a piece size aims at. Its window is then held within a
// few per cent even by one connection; docs/design.md gives ±1% for a key's
// total once each connection sends about 40 a second, out of phase.
inline constexpr uint32_t kPiecesPerSecond = 40;
// Levels from this one up (a piece of 64 KiB leaves 40 times a second or
// more) are left to the kernel's own packets.
inline constexpr uint64_t kShapeBelowBytesPerSec =
    uint64_t{kPiecesPerSecond} * kMaxPieceBytes;  // 2 560 KiB/s
// The smallest piece at a low level: below it, headers would be more than
// a sixth of the bytes on the wire.
inline constexpr uint32_t kMinPieceBytes = 256;
// The kernel's unpaced start (tcp_update_skb_after_send paces from the
// 10th data segment on), and the size of the pieces that use it up.
inline constexpr uint32_t kFirstPieces = 10;
inline constexpr uint32_t kFirstPieceBytes = 100;
// Variation indexes: 0 .. kVarySteps - 1.
inline constexpr uint32_t kVarySteps = 64;
// Pieces a second a whole key needs at most: its connections are out of
// step, so the key's 1 s windows hold within about a per cent once they
// send this many together (n connections of pieces P vary a window by
// about P x sqrt(n / 12)). A key of many connections gets larger pieces
// than level / 40 (10 clients of 1 000 connections at 10 KB/s each would
// otherwise be 400 000 packets a second).
inline constexpr uint32_t kKeyPiecesPerSecond = 1000;

// How one connection's sends are cut. piece == 0 and first_left == 0:
// unshaped, the call goes to the kernel whole.
struct Shape {
  // The size of its pieces at its level; 0: the kernel's packets are small
  // enough (or it is not paced).
  uint32_t piece = 0;
  // Of the kernel's first kFirstPieces segments, how many are still to be
  // sent as tiny pieces.
  uint32_t first_left = 0;
  // Its maximum segment size: a call never ends in a piece smaller than one
  // MSS unless the call itself is (Nagle could hold such a tail for a round
  // trip; the kernel never holds a full segment).
  uint32_t mss = 0;
  // The pacing applied to the connection (0: not paced).
  uint64_t level = 0;

  bool Active() const { return piece != 0 || first_left != 0; }
};

// The most one kernel call should carry for a connection paced at `level`
// that is not cut into pieces, so that a long blocking call (a whole file's
// sendfile) is counted as it goes rather than when it returns: a quarter
// of a second at the level, at least 256 KiB; 0 (no limit) when not paced.
inline size_t ChunkBytes(uint64_t level) {
  if (level == 0 || level == ~uint64_t{0}) return 0;
  const uint64_t quarter = level / 4;
  return quarter < (256u << 10) ? (256u << 10) : static_cast<size_t>(quarter);
}

// A connection's place among kVarySteps piece sizes, from its zone slot:
// neighbouring slots (the connections of one client, usually) land far
// apart.
inline uint32_t VaryIndex(uint32_t conn_index) {
  return (conn_index * 0x9E3779B9u) >> 26;  // top 6 bits
}

// The piece size for a connection paced at `level` bytes a second
// (0 or ~0: not paced) whose key's rate is `key_rate` (0: not known):
// about level / 40, from level / 56 to level / 28 as `vary` goes from 0
// to kVarySteps - 1, and at least about key_rate / kKeyPiecesPerSecond
// (varied the same way); at least kMinPieceBytes, at most kMaxPieceBytes;
// 0 from kShapeBelowBytesPerSec up.
uint32_t PieceBytes(uint64_t level, uint32_t vary, uint64_t key_rate = 0);

// Cuts one call of `total` bytes into pieces, in order. A small value: copy
// it to plan ahead, and replay the pieces the kernel took on the original.
class PieceCursor {
 public:
  PieceCursor(const Shape& shape, size_t total);
  // The next piece's size, at most `max` (what the caller can carry at
  // once), and moves past it; 0 once every byte has a piece.
  size_t Next(size_t max = ~size_t{0});
  // Bytes not given to a piece yet.
  size_t left() const { return left_; }
  // Of the shape's first pieces, how many Next gave.
  uint32_t first_used() const { return first_used_; }
  // Whether the call is cut at all: false when it goes to the kernel as
  // one call, as the host made it (an unshaped level, with no first pieces
  // or first pieces that would leave a tail under one MSS).
  bool Cut() const { return cut_; }
  // Whether only the call's first pieces are cut (its level is left to the
  // kernel's packets): after them, the rest is one piece, which a sendfile
  // leaves to the kernel's own (zero-copy) call.
  bool FirstOnly() const { return cut_ && shape_.piece == 0; }
  // The bytes of the first pieces still to be given.
  size_t FirstBytesLeft() const {
    return size_t{shape_.first_left - first_used_} * kFirstPieceBytes;
  }
  const Shape& shape() const { return shape_; }

 private:
  Shape shape_;
  size_t left_;
  uint32_t first_used_ = 0;
  bool cut_ = false;
};

// Whether a new connection paced at `level` should send its first
// segments as first pieces, given its MSS and its round trip (µs, as the
// handshake measured it). First pieces fill the initial congestion window
// (10 segments, like the unpaced start) with about 1 KB, so the rest of a
// response waits one round trip for their acknowledgements (measured
// through a 10 and a 40 ms delay line; TCP_NODELAY makes no difference).
// That round trip buys nothing where the rate itself allows 10 segments
// in it: the kernel's unpaced start is then no excess.
inline bool FirstPiecesPay(uint64_t level, uint32_t mss, uint32_t rtt_us) {
  if (rtt_us == 0) return true;
  return level < uint64_t{kFirstPieces} * mss * 1'000'000 / rtt_us;
}

// Segments the kernel makes of `bytes` written as one piece at `mss`: what
// an uncut call uses of the first pieces.
inline uint32_t SegmentsOf(size_t bytes, uint32_t mss) {
  if (mss == 0) mss = 1448;
  const size_t segments = (bytes + mss - 1) / mss;
  return segments > kFirstPieces ? kFirstPieces
                                 : static_cast<uint32_t>(segments);
}

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BUDGET_SHAPER_H_
