#include "src/cluster/cluster.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ClusterKeyNameTest, IsNamespacedByZoneAndHidesTheAddress) {
  const unsigned char addr[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                  0, 0, 0xff, 0xff, 192, 0, 2, 7};
  const std::string a = ClusterKeyName("web", addr, sizeof(addr), "secret");
  EXPECT_EQ(a.size(), std::string("trafficrate:web:").size() + 16);
  EXPECT_EQ(a.rfind("trafficrate:web:", 0), 0u);
  EXPECT_THAT(a, Not(HasSubstr("192")));
  // The same on every host with the secret; another secret, zone or key
  // gives another name.
  EXPECT_EQ(a, ClusterKeyName("web", addr, sizeof(addr), "secret"));
  EXPECT_NE(a.substr(16),
            ClusterKeyName("web", addr, sizeof(addr), "other").substr(16));
  EXPECT_NE(a, ClusterKeyName("api", addr, sizeof(addr), "secret"));
  unsigned char next[16];
  std::copy(addr, addr + 16, next);
  next[15] = 8;
  EXPECT_NE(a, ClusterKeyName("web", next, sizeof(next), "secret"));
}

double Sum(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0);
}

TEST(MaxMinSharesTest, EveryConnectionGetsAnEqualShareWhenAllWantMore) {
  // 3 downloads on one host, 1 on the other: 3/4 and 1/4 of the rate.
  const std::vector<double> s = MaxMinShares(1000, {{kInf, 3}, {kInf, 1}});
  EXPECT_THAT(s, ElementsAre(750, 250));
  // 2 and 2.
  EXPECT_THAT(MaxMinShares(1000, {{kInf, 2}, {kInf, 2}}),
              ElementsAre(500, 500));
}

TEST(MaxMinSharesTest, AHostThatWantsLessLeavesTheRestToTheOthers) {
  // Host 0's one connection wants 100 of its 333: hosts 1 and 2 split 900.
  const std::vector<double> s =
      MaxMinShares(1000, {{100, 1}, {kInf, 1}, {kInf, 2}});
  EXPECT_DOUBLE_EQ(s[0], 100);
  EXPECT_DOUBLE_EQ(s[1], 300);
  EXPECT_DOUBLE_EQ(s[2], 600);
  EXPECT_DOUBLE_EQ(Sum(s), 1000);
}

TEST(MaxMinSharesTest, SpareRateIsSpreadByConnectionsWhenNoneWantsIt) {
  const std::vector<double> s = MaxMinShares(1000, {{100, 1}, {200, 3}});
  // Demands 100 and 200; the spare 700 by connections: 175 and 525.
  EXPECT_DOUBLE_EQ(s[0], 275);
  EXPECT_DOUBLE_EQ(s[1], 725);
}

TEST(MaxMinSharesTest, HostsWithoutConnectionsAndBadFiguresGetNothing) {
  EXPECT_THAT(MaxMinShares(1000, {{kInf, 0}, {kInf, 2}}), ElementsAre(0, 1000));
  EXPECT_THAT(MaxMinShares(1000, {{kInf, 0}}), ElementsAre(0));
  EXPECT_THAT(MaxMinShares(0, {{kInf, 1}}), ElementsAre(0));
  EXPECT_TRUE(MaxMinShares(1000, {}).empty());
  // A NaN or negative demand counts as none: that host gets its part of
  // the spare only.
  const std::vector<double> s =
      MaxMinShares(1000, {{std::nan(""), 1}, {-5, 1}, {kInf, 2}});
  EXPECT_DOUBLE_EQ(Sum(s), 1000);
  EXPECT_DOUBLE_EQ(s[0], 0);
  EXPECT_DOUBLE_EQ(s[1], 0);
  EXPECT_DOUBLE_EQ(s[2], 1000);
}

TEST(FallbackShareTest, MovesFromTheLastShareToTheFullRate) {
  EXPECT_DOUBLE_EQ(FallbackShare(250, 1000, 0, 5'000'000'000), 250);
  EXPECT_DOUBLE_EQ(FallbackShare(250, 1000, 2'500'000'000, 5'000'000'000), 625);
  EXPECT_DOUBLE_EQ(FallbackShare(250, 1000, 5'000'000'000, 5'000'000'000),
                   1000);
  EXPECT_DOUBLE_EQ(FallbackShare(250, 1000, 9'000'000'000, 5'000'000'000),
                   1000);
  // Never above the local rate, whatever was stored.
  EXPECT_DOUBLE_EQ(FallbackShare(5000, 1000, 1, 5'000'000'000), 1000);
  EXPECT_DOUBLE_EQ(FallbackShare(std::nan(""), 1000, 1, 5'000'000'000), 1000);
}

}  // namespace
}  // namespace trafficrate
