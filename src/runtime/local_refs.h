// What one process holds of a zone connection slot (the Governor's
// LocalConn::refs), as a value: the cookie of the registration its fds refer
// to (ConnTable::CookieOf), in the high half, and how many of its fds refer
// to it, in the low half. A registration that ended and was replaced in the
// slot has another cookie: the fds of the old one no longer count, and the
// first fd of the new one starts a new count.
//
//   uint64_t seen = refs.load(std::memory_order_relaxed);
//   while (!refs.compare_exchange_weak(
//       seen, LocalRefs::From(seen).Added(cookie).word())) {
//   }
//
// Trivially copyable, one uint64_t; constexpr throughout. Hot path: no
// allocation, errno untouched.

#ifndef TRAFFICRATE_SRC_RUNTIME_LOCAL_REFS_H_
#define TRAFFICRATE_SRC_RUNTIME_LOCAL_REFS_H_

#include <cstdint>
#include <type_traits>

namespace trafficrate {

class LocalRefs {
 public:
  constexpr LocalRefs() = default;  // no fd on any registration
  static constexpr LocalRefs From(uint64_t word) { return LocalRefs(word); }
  static constexpr LocalRefs Of(uint32_t cookie, uint32_t count) {
    return LocalRefs(uint64_t{cookie} << 32 | count);
  }

  constexpr uint64_t word() const { return word_; }
  constexpr uint32_t cookie() const {
    return static_cast<uint32_t>(word_ >> 32);
  }
  constexpr uint32_t count() const { return static_cast<uint32_t>(word_); }

  // Whether fds of this process refer to the registration with cookie
  // `registration`.
  constexpr bool Holds(uint32_t registration) const {
    return cookie() == registration && count() > 0;
  }
  // One more fd on the registration with cookie `registration`: one more in
  // its count, or the first of a new count if another was counted.
  constexpr LocalRefs Added(uint32_t registration) const {
    return cookie() == registration ? Of(registration, count() + 1)
                                    : Of(registration, 1);
  }
  // One fd fewer on the registration counted. REQUIRES: count() > 0.
  constexpr LocalRefs Dropped() const { return Of(cookie(), count() - 1); }

  friend constexpr bool operator==(LocalRefs a, LocalRefs b) {
    return a.word_ == b.word_;
  }
  friend constexpr bool operator!=(LocalRefs a, LocalRefs b) {
    return a.word_ != b.word_;
  }

 private:
  explicit constexpr LocalRefs(uint64_t word) : word_(word) {}

  uint64_t word_ = 0;
};
static_assert(std::is_trivially_copyable_v<LocalRefs> &&
              sizeof(LocalRefs) == sizeof(uint64_t));

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_LOCAL_REFS_H_
