// LocalRefs (local_refs.h): its encode and decode, tested here once, and
// how a count follows its registration's cookie.

#include "src/runtime/local_refs.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace trafficrate {
namespace {

TEST(LocalRefsTest, RoundTripsTheCookieHighAndTheCountLow) {
  struct Case {
    uint32_t cookie;
    uint32_t count;
  };
  for (const Case c :
       {Case{0, 0}, Case{1, 1}, Case{0x7fffffff, 3}, Case{12345, 0xffffffff}}) {
    const LocalRefs refs = LocalRefs::Of(c.cookie, c.count);
    EXPECT_EQ(refs.word(), uint64_t{c.cookie} << 32 | c.count);
    EXPECT_EQ(refs.cookie(), c.cookie);
    EXPECT_EQ(refs.count(), c.count);
    EXPECT_EQ(LocalRefs::From(refs.word()), refs);
  }
  EXPECT_EQ(LocalRefs().word(), 0u);
}

TEST(LocalRefsTest, ACountFollowsItsRegistrationOnly) {
  LocalRefs refs;
  EXPECT_FALSE(refs.Holds(0)) << "no fd at all";
  refs = refs.Added(5);
  EXPECT_EQ(refs, LocalRefs::Of(5, 1));
  refs = refs.Added(5);  // a dup
  EXPECT_EQ(refs, LocalRefs::Of(5, 2));
  EXPECT_TRUE(refs.Holds(5));
  EXPECT_FALSE(refs.Holds(7)) << "an ended registration's fd";
  refs = refs.Dropped();
  EXPECT_EQ(refs, LocalRefs::Of(5, 1));
  refs = refs.Dropped();
  EXPECT_EQ(refs, LocalRefs::Of(5, 0));
  EXPECT_FALSE(refs.Holds(5)) << "its last fd closed";
  // The slot registered again: the old count does not carry over.
  EXPECT_EQ(LocalRefs::Of(5, 3).Added(7), LocalRefs::Of(7, 1));
}

}  // namespace
}  // namespace trafficrate
