#include "src/budget/shaper.h"

namespace trafficrate {
namespace {

// Ethernet's MSS with timestamps, for a connection whose MSS is not known.
constexpr uint32_t kDefaultMss = 1448;
// PieceBytes spans level / kSlowDivisor (vary 0) to about twice that.
constexpr uint64_t kSlowDivisor = 56;
// The same for the key's floor: key_rate / kKeySlowDivisor to twice that,
// about key_rate / kKeyPiecesPerSecond.
constexpr uint64_t kKeySlowDivisor = kKeyPiecesPerSecond * 7 / 5;

}  // namespace

uint32_t PieceBytes(uint64_t level, uint32_t vary, uint64_t key_rate) {
  if (level == 0 || level >= kShapeBelowBytesPerSec) return 0;
  if (vary >= kVarySteps) vary = kVarySteps - 1;
  // level < 2^22 here, so the product cannot overflow.
  uint64_t piece = level * (kVarySteps + vary) / (kVarySteps * kSlowDivisor);
  // A key's rate may be anything up to 2^50 or so (rules); its floor only
  // matters up to kMaxPieceBytes.
  const uint64_t key_floor =
      key_rate >= kMaxPieceBytes * kKeySlowDivisor
          ? kMaxPieceBytes
          : key_rate * (kVarySteps + vary) / (kVarySteps * kKeySlowDivisor);
  if (piece < key_floor) piece = key_floor;
  if (piece < kMinPieceBytes) piece = kMinPieceBytes;
  if (piece > kMaxPieceBytes) piece = kMaxPieceBytes;
  return static_cast<uint32_t>(piece);
}

PieceCursor::PieceCursor(const Shape& shape, size_t total)
    : shape_(shape), left_(total) {
  if (shape_.mss == 0) shape_.mss = kDefaultMss;
  // First pieces only where what follows them is at least one MSS, so that
  // the call never ends in a small segment that it would not have ended in
  // (a response shorter than that was at most two segments anyway).
  const size_t tiny = size_t{shape_.first_left} * kFirstPieceBytes;
  if (shape_.first_left == 0 || total <= tiny + shape_.mss) {
    shape_.first_left = 0;
  }
  // Nothing to cut in an empty call (or one whose iovecs the kernel will
  // refuse, which its caller counts as 0 bytes): it goes to the kernel.
  cut_ = total != 0 && (shape_.piece != 0 || shape_.first_left != 0);
}

size_t PieceCursor::Next(size_t max) {
  if (left_ == 0 || max == 0) return 0;
  size_t piece;
  const bool first = cut_ && first_used_ < shape_.first_left;
  if (!cut_) {
    piece = left_;
  } else if (first) {
    piece = kFirstPieceBytes;  // never the whole rest (constructor)
  } else if (shape_.piece == 0 || shape_.piece >= left_) {
    piece = left_;
  } else if (shape_.piece >= shape_.mss && left_ - shape_.piece < shape_.mss) {
    // It would leave a tail under one MSS: take that along.
    piece = left_;
  } else {
    piece = shape_.piece;
  }
  if (piece > max) piece = max;
  if (first) ++first_used_;
  left_ -= piece;
  return piece;
}

}  // namespace trafficrate
