#include "src/config/cluster_url.h"

#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseClusterUrlTest, TakesHostPortDbAndCredentials) {
  absl::StatusOr<ClusterUrl> url = ParseClusterUrl("redis://10.0.0.5:6380/2");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "10.0.0.5");
  EXPECT_EQ(url->port, 6380);
  EXPECT_EQ(url->db, 2);
  EXPECT_EQ(url->password, "");

  url = ParseClusterUrl("redis://redis.internal");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "redis.internal");
  EXPECT_EQ(url->port, 6379);
  EXPECT_EQ(url->db, 0);

  url = ParseClusterUrl("redis://[::1]:7000/15");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->port, 7000);
  EXPECT_EQ(url->db, 15);

  url = ParseClusterUrl("redis://:s3cr@t@127.0.0.1");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->user, "");
  EXPECT_EQ(url->password, "s3cr@t");
  EXPECT_EQ(DescribeClusterUrl(*url), "redis://:***@127.0.0.1:6379/0");

  url = ParseClusterUrl("redis://fleet:pw@[2001:db8::5]");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(url->user, "fleet");
  EXPECT_EQ(DescribeClusterUrl(*url), "redis://fleet:***@[2001:db8::5]:6379/0");
}

TEST(ParseClusterUrlTest, RefusesWithTheVariableAndTheFormNeverThePassword) {
  for (const char* bad :
       {"", "http://x", "redis://", "redis://:6379", "redis://h:0",
        "redis://h:65536", "redis://h:", "redis://h/x", "redis://h/-1",
        "redis://[::1", "redis://[::1]x", "redis://[zz]", "redis://h h",
        "redis://user@h", "redis://u:@h", "redis://h:6379/99999999999"}) {
    absl::StatusOr<ClusterUrl> url = ParseClusterUrl(bad);
    ASSERT_FALSE(url.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(url.status())) << bad;
    EXPECT_THAT(url.status().message(), HasSubstr("TRAFFICRATE_CLUSTER: "));
    EXPECT_THAT(url.status().message(),
                HasSubstr("redis://[[USER]:PASSWORD@]"));
  }
  absl::StatusOr<ClusterUrl> url = ParseClusterUrl("redis://:hunter2@h:0");
  ASSERT_FALSE(url.ok());
  EXPECT_THAT(url.status().message(), Not(HasSubstr("hunter2")));
  url = ParseClusterUrl("rediss://h");
  ASSERT_FALSE(url.ok());
  EXPECT_THAT(url.status().message(), HasSubstr("no TLS"));
}

TEST(ClusterHostIdTest, IsTheHostOrElseTheHostnameThenTheZone) {
  EXPECT_EQ(ClusterHostId("web1", "nginx"), "web1/nginx");
  char hostname[256] = {};
  ASSERT_EQ(gethostname(hostname, sizeof(hostname) - 1), 0);
  EXPECT_EQ(ClusterHostId("", "nginx"), std::string(hostname) + "/nginx");
}

}  // namespace
}  // namespace trafficrate
