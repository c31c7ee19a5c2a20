#include "src/net/key.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

sockaddr_in V4(const char* text, uint16_t port = 0) {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET, text, &addr.sin_addr), 1) << text;
  return addr;
}

sockaddr_in6 V6(const char* text, uint16_t port = 0) {
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET6, text, &addr.sin6_addr), 1) << text;
  return addr;
}

const sockaddr* Sa(const sockaddr_in& addr) {
  return reinterpret_cast<const sockaddr*>(&addr);
}
const sockaddr* Sa(const sockaddr_in6& addr) {
  return reinterpret_cast<const sockaddr*>(&addr);
}

KeySpec Spec(const char* text) { return ParseKeySpec(text).value(); }

// The key of a connection from `peer` to 192.0.2.1:80.
ConnKey PeerKey(const KeySpec& spec, const sockaddr_in& peer) {
  const sockaddr_in local = V4("192.0.2.1", 80);
  ConnKey key;
  EXPECT_TRUE(MakeConnKey(spec, Sa(peer), sizeof(peer), Sa(local),
                          sizeof(local), &key));
  return key;
}
ConnKey PeerKey(const KeySpec& spec, const sockaddr_in6& peer) {
  const sockaddr_in6 local = V6("2001:db8::1", 80);
  ConnKey key;
  EXPECT_TRUE(MakeConnKey(spec, Sa(peer), sizeof(peer), Sa(local),
                          sizeof(local), &key));
  return key;
}

void ExpectKeyError(const char* value) {
  const absl::Status status = ParseKeySpec(value).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
  EXPECT_THAT(std::string(status.message()), HasSubstr("TRAFFICRATE_KEY: "));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("use peer, peer/N or peer/N,M"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n")));
}

TEST(ParseKeySpecTest, PeerIsFullAddress) {
  const KeySpec spec = Spec("peer");
  EXPECT_EQ(spec.mode, KeyMode::kPeer);
  EXPECT_EQ(spec.v4_prefix, 32);
  EXPECT_EQ(spec.v6_prefix, 128);
}

TEST(ParseKeySpecTest, PeerWithV4PrefixKeepsFullV6) {
  const KeySpec spec = Spec("peer/24");
  EXPECT_EQ(spec.mode, KeyMode::kPeer);
  EXPECT_EQ(spec.v4_prefix, 24);
  EXPECT_EQ(spec.v6_prefix, 128);
}

TEST(ParseKeySpecTest, PeerWithBothPrefixes) {
  const KeySpec spec = Spec("peer/24,64");
  EXPECT_EQ(spec.v4_prefix, 24);
  EXPECT_EQ(spec.v6_prefix, 64);
  const KeySpec edges = Spec("peer/0,0");
  EXPECT_EQ(edges.v4_prefix, 0);
  EXPECT_EQ(edges.v6_prefix, 0);
  const KeySpec full = Spec("peer/32,128");
  EXPECT_EQ(full.v4_prefix, 32);
  EXPECT_EQ(full.v6_prefix, 128);
}

TEST(ParseKeySpecTest, LocalAndAll) {
  EXPECT_EQ(Spec("local").mode, KeyMode::kLocal);
  EXPECT_EQ(Spec("all").mode, KeyMode::kAll);
}

TEST(ParseKeySpecTest, BadPrefixesAreRefused) {
  for (const char* value :
       {"peer/33", "peer/24,129", "peer/", "peer/a", "peer/24,", "peer/,64",
        "peer/-1", "peer/+24", "peer/ 24", "peer/24 ", "peer/0024",
        "peer/24,64,1", "peer/24/64"}) {
    ExpectKeyError(value);
  }
}

TEST(ParseKeySpecTest, OtherWordsAreRefused) {
  for (const char* value : {"peers", "PEER", "Peer", " peer", "peer ",
                            "local/24", "all/0", "remote_addr", "peer\n"}) {
    ExpectKeyError(value);
  }
}

TEST(ParseKeySpecTest, EmptyIsAnError) {
  ExpectKeyError("");
  EXPECT_THAT(std::string(ParseKeySpec("").status().message()),
              HasSubstr("TRAFFICRATE_KEY: empty; "));
}

TEST(MakeConnKeyTest, V4PeerIsV4Mapped) {
  const ConnKey key = PeerKey(Spec("peer"), V4("10.1.2.3", 5555));
  const uint8_t want[20] = {0,    0,    0,  0, 0, 0, 0, 0, 0, 0,
                            0xff, 0xff, 10, 1, 2, 3, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(key.bytes, want, sizeof(want)), 0);
}

TEST(MakeConnKeyTest, V6PeerIsItsAddress) {
  const sockaddr_in6 peer = V6("2001:db8::7", 5555);
  const ConnKey key = PeerKey(Spec("peer"), peer);
  EXPECT_EQ(std::memcmp(key.bytes, &peer.sin6_addr, 16), 0);
  const uint8_t zeros[4] = {};
  EXPECT_EQ(std::memcmp(key.bytes + 16, zeros, 4), 0);
}

TEST(MakeConnKeyTest, V4MappedV6PeerEqualsPlainV4Peer) {
  for (const char* spec : {"peer", "peer/24", "peer/0,0"}) {
    EXPECT_EQ(PeerKey(Spec(spec), V6("::ffff:10.1.2.3", 1)),
              PeerKey(Spec(spec), V4("10.1.2.3", 2)))
        << spec;
  }
}

TEST(MakeConnKeyTest, DifferentPeersDiffer) {
  EXPECT_NE(PeerKey(Spec("peer"), V4("10.1.2.3")),
            PeerKey(Spec("peer"), V4("10.1.2.4")));
  EXPECT_NE(PeerKey(Spec("peer"), V6("::1")),
            PeerKey(Spec("peer"), V4("0.0.0.1")));
}

TEST(MakeConnKeyTest, V4PrefixMasksTheNetwork) {
  const KeySpec spec = Spec("peer/24");
  EXPECT_EQ(PeerKey(spec, V4("10.1.2.3")), PeerKey(spec, V4("10.1.2.250")));
  EXPECT_NE(PeerKey(spec, V4("10.1.2.3")), PeerKey(spec, V4("10.1.3.3")));
  EXPECT_EQ(PeerKey(spec, V4("10.1.2.3")),
            PeerKey(Spec("peer"), V4("10.1.2.0")));
}

TEST(MakeConnKeyTest, OddV4PrefixMasksInsideAByte) {
  const KeySpec spec = Spec("peer/20");
  EXPECT_EQ(PeerKey(spec, V4("10.1.31.3")),
            PeerKey(Spec("peer"), V4("10.1.16.0")));
}

TEST(MakeConnKeyTest, V4PrefixLeavesV6Alone) {
  const KeySpec spec = Spec("peer/24");
  EXPECT_NE(PeerKey(spec, V6("2001:db8::1")), PeerKey(spec, V6("2001:db8::2")));
}

TEST(MakeConnKeyTest, V6PrefixMasksTheNetwork) {
  const KeySpec spec = Spec("peer/32,64");
  EXPECT_EQ(PeerKey(spec, V6("2001:db8:1:2:a::1")),
            PeerKey(spec, V6("2001:db8:1:2:b::9")));
  EXPECT_NE(PeerKey(spec, V6("2001:db8:1:2::1")),
            PeerKey(spec, V6("2001:db8:1:3::1")));
  EXPECT_EQ(PeerKey(spec, V6("2001:db8:1:2:a::1")),
            PeerKey(Spec("peer"), V6("2001:db8:1:2::")));
  // The v4 prefix still applies in full to IPv4 peers.
  EXPECT_NE(PeerKey(spec, V4("10.0.0.1")), PeerKey(spec, V4("10.0.0.2")));
}

TEST(MakeConnKeyTest, ZeroPrefixGroupsEachFamily) {
  const KeySpec spec = Spec("peer/0,0");
  EXPECT_EQ(PeerKey(spec, V4("10.0.0.1")), PeerKey(spec, V4("192.168.9.9")));
  EXPECT_EQ(PeerKey(spec, V6("2001:db8::1")), PeerKey(spec, V6("fe80::1")));
  // IPv4 stays apart from IPv6 even at /0: the mapped prefix is kept.
  EXPECT_NE(PeerKey(spec, V4("10.0.0.1")), PeerKey(spec, V6("2001:db8::1")));
}

TEST(MakeConnKeyTest, OutOfRangePrefixesAreClamped) {
  KeySpec spec;
  spec.v4_prefix = 99;
  spec.v6_prefix = -5;
  EXPECT_EQ(PeerKey(spec, V4("10.0.0.1")),
            PeerKey(Spec("peer"), V4("10.0.0.1")));
  EXPECT_EQ(PeerKey(spec, V6("2001:db8::1")), PeerKey(spec, V6("fe80::1")));
}

TEST(MakeConnKeyTest, LocalUsesLocalAddressAndPort) {
  const KeySpec spec = Spec("local");
  const sockaddr_in peer = V4("10.0.0.1", 40000);
  const sockaddr_in local = V4("127.0.0.1", 8080);
  ConnKey key;
  ASSERT_TRUE(MakeConnKey(spec, Sa(peer), sizeof(peer), Sa(local),
                          sizeof(local), &key));
  const uint8_t want[20] = {0,    0,    0,   0, 0, 0, 0,    0,    0, 0,
                            0xff, 0xff, 127, 0, 0, 1, 0x1f, 0x90, 0, 0};
  EXPECT_EQ(std::memcmp(key.bytes, want, sizeof(want)), 0);

  const sockaddr_in other_port = V4("127.0.0.1", 8081);
  ConnKey key2;
  ASSERT_TRUE(MakeConnKey(spec, Sa(peer), sizeof(peer), Sa(other_port),
                          sizeof(other_port), &key2));
  EXPECT_NE(key, key2);
}

TEST(MakeConnKeyTest, LocalV4MappedEqualsPlainV4) {
  const KeySpec spec = Spec("local");
  const sockaddr_in local4 = V4("127.0.0.1", 8080);
  const sockaddr_in6 local6 = V6("::ffff:127.0.0.1", 8080);
  ConnKey key4;
  ConnKey key6;
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(local4), sizeof(local4), &key4));
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(local6), sizeof(local6), &key6));
  EXPECT_EQ(key4, key6);
}

TEST(MakeConnKeyTest, LocalIgnoresPeerPrefixes) {
  KeySpec spec = Spec("local");
  spec.v4_prefix = 8;
  const sockaddr_in a = V4("127.0.0.1", 80);
  const sockaddr_in b = V4("127.0.0.2", 80);
  ConnKey key_a;
  ConnKey key_b;
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(a), sizeof(a), &key_a));
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(b), sizeof(b), &key_b));
  EXPECT_NE(key_a, key_b);
}

TEST(MakeConnKeyTest, AllIsZeroWhateverTheAddresses) {
  const KeySpec spec = Spec("all");
  const ConnKey zero;
  EXPECT_EQ(PeerKey(spec, V4("10.0.0.1", 1)), zero);
  EXPECT_EQ(PeerKey(spec, V6("2001:db8::1", 1)), zero);
  ConnKey key;
  std::memset(key.bytes, 0xaa, sizeof(key.bytes));
  EXPECT_TRUE(MakeConnKey(spec, nullptr, 0, nullptr, 0, &key));
  EXPECT_EQ(key, zero);
}

TEST(MakeConnKeyTest, NonInetFamiliesAreRefused) {
  sockaddr_un unix_addr = {};
  unix_addr.sun_family = AF_UNIX;
  std::strcpy(unix_addr.sun_path, "/tmp/socket");
  const auto* sa = reinterpret_cast<const sockaddr*>(&unix_addr);
  ConnKey key;
  std::memset(key.bytes, 0xaa, sizeof(key.bytes));
  EXPECT_FALSE(MakeConnKey(Spec("peer"), sa, sizeof(unix_addr), sa,
                           sizeof(unix_addr), &key));
  EXPECT_EQ(key, ConnKey());
  EXPECT_FALSE(MakeConnKey(Spec("local"), sa, sizeof(unix_addr), sa,
                           sizeof(unix_addr), &key));
}

TEST(MakeConnKeyTest, NullOrShortAddressesAreRefused) {
  const sockaddr_in v4 = V4("10.0.0.1", 80);
  const sockaddr_in6 v6 = V6("2001:db8::1", 80);
  ConnKey key;
  EXPECT_FALSE(
      MakeConnKey(Spec("peer"), nullptr, sizeof(v4), Sa(v4), sizeof(v4), &key));
  EXPECT_FALSE(MakeConnKey(Spec("local"), Sa(v4), sizeof(v4), nullptr,
                           sizeof(v4), &key));
  EXPECT_FALSE(MakeConnKey(Spec("peer"), Sa(v4), 0, nullptr, 0, &key));
  EXPECT_FALSE(MakeConnKey(Spec("peer"), Sa(v4), 1, nullptr, 0, &key));
  EXPECT_FALSE(
      MakeConnKey(Spec("peer"), Sa(v4), sizeof(v4) - 1, nullptr, 0, &key));
  EXPECT_FALSE(
      MakeConnKey(Spec("peer"), Sa(v6), sizeof(v6) - 1, nullptr, 0, &key));
  // A sockaddr_in6 claiming to be only as long as a sockaddr_in.
  EXPECT_FALSE(
      MakeConnKey(Spec("peer"), Sa(v6), sizeof(sockaddr_in), nullptr, 0, &key));
  EXPECT_EQ(key, ConnKey());
}

TEST(MakeConnKeyTest, AcceptsUnalignedAddressesAndLongerBuffers) {
  const sockaddr_in6 v6 = V6("2001:db8::1", 80);
  alignas(16) char buffer[sizeof(sockaddr_storage) + 1] = {};
  std::memcpy(buffer + 1, &v6, sizeof(v6));
  const auto* sa = reinterpret_cast<const sockaddr*>(buffer + 1);
  ConnKey key;
  ASSERT_TRUE(MakeConnKey(Spec("peer"), sa, sizeof(sockaddr_storage), nullptr,
                          0, &key));
  EXPECT_EQ(key, PeerKey(Spec("peer"), v6));
}

TEST(MakeConnKeyTest, LeavesErrnoAlone) {
  const sockaddr_in v4 = V4("10.0.0.1", 80);
  ConnKey key;
  errno = 1234;
  EXPECT_TRUE(MakeConnKey(Spec("peer"), Sa(v4), sizeof(v4), nullptr, 0, &key));
  EXPECT_FALSE(MakeConnKey(Spec("peer"), nullptr, 0, nullptr, 0, &key));
  EXPECT_EQ(errno, 1234);
}

TEST(FormatConnKeyTest, PeerAddresses) {
  EXPECT_EQ(FormatConnKey(PeerKey(Spec("peer"), V4("127.0.0.2")), Spec("peer")),
            "127.0.0.2");
  EXPECT_EQ(FormatConnKey(PeerKey(Spec("peer"), V6("::1")), Spec("peer")),
            "::1");
  EXPECT_EQ(
      FormatConnKey(PeerKey(Spec("peer"), V6("::ffff:10.0.0.9")), Spec("peer")),
      "10.0.0.9");
}

TEST(FormatConnKeyTest, PrefixShownOnlyWhenShorter) {
  const KeySpec spec = Spec("peer/24,64");
  EXPECT_EQ(FormatConnKey(PeerKey(spec, V4("10.1.2.77")), spec), "10.1.2.0/24");
  EXPECT_EQ(FormatConnKey(PeerKey(spec, V6("2001:db8::9")), spec),
            "2001:db8::/64");
  const KeySpec v4_only = Spec("peer/24");
  EXPECT_EQ(FormatConnKey(PeerKey(v4_only, V6("2001:db8::9")), v4_only),
            "2001:db8::9");
  const KeySpec zero = Spec("peer/0,0");
  EXPECT_EQ(FormatConnKey(PeerKey(zero, V4("10.1.2.77")), zero), "0.0.0.0/0");
  EXPECT_EQ(FormatConnKey(PeerKey(zero, V6("2001:db8::9")), zero), "::/0");
}

TEST(FormatConnKeyTest, LocalShowsPort) {
  const KeySpec spec = Spec("local");
  ConnKey key;
  const sockaddr_in v4 = V4("127.0.0.1", 8080);
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(v4), sizeof(v4), &key));
  EXPECT_EQ(FormatConnKey(key, spec), "127.0.0.1:8080");
  const sockaddr_in6 v6 = V6("::1", 8080);
  ASSERT_TRUE(MakeConnKey(spec, nullptr, 0, Sa(v6), sizeof(v6), &key));
  EXPECT_EQ(FormatConnKey(key, spec), "[::1]:8080");
}

TEST(FormatConnKeyTest, AllIsAll) {
  EXPECT_EQ(FormatConnKey(ConnKey(), Spec("all")), "all");
}

TEST(FormatConnKeyTest, RoundTripsCanonicalAddresses) {
  for (const char* text : {"0.0.0.0", "1.2.3.4", "255.255.255.255"}) {
    EXPECT_EQ(FormatConnKey(PeerKey(Spec("peer"), V4(text)), Spec("peer")),
              text);
  }
  for (const char* text :
       {"::", "::2", "2001:db8::1", "fe80::1:2:3:4", "2001:db8:1:2:3:4:5:6"}) {
    EXPECT_EQ(FormatConnKey(PeerKey(Spec("peer"), V6(text)), Spec("peer")),
              text);
  }
}

}  // namespace
}  // namespace trafficrate
