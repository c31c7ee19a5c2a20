#include "src/net/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace trafficrate {
namespace {

// The 16-byte form of a literal the test knows to be good.
struct Addr {
  uint8_t bytes[16] = {};
  bool v4 = false;
};

Addr Parse(const char* text) {
  Addr a;
  EXPECT_TRUE(ParseAddress16(text, a.bytes, &a.v4)) << text;
  return a;
}

TEST(AddressTest, IPv4IsHeldInItsMappedForm) {
  const uint8_t v4[4] = {192, 0, 2, 1};
  uint8_t addr[16];
  MapV4(v4, addr);
  const uint8_t mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                              0, 0, 0xff, 0xff, 192, 0, 2, 1};
  EXPECT_EQ(std::memcmp(addr, mapped, 16), 0);
  EXPECT_TRUE(IsV4Mapped(addr));
  EXPECT_FALSE(IsV4Mapped(Parse("2001:db8::1").bytes));
  EXPECT_FALSE(IsV4Mapped(Parse("::").bytes));
  EXPECT_FALSE(IsV4Mapped(Parse("::1.2.3.4").bytes)) << "IPv4-compatible";
}

TEST(AddressTest, ParsesEitherFamilyAndSaysWhich) {
  const Addr v4 = Parse("192.0.2.1");
  EXPECT_TRUE(v4.v4);
  EXPECT_TRUE(IsV4Mapped(v4.bytes));
  EXPECT_EQ(v4.bytes[12], 192);
  EXPECT_EQ(v4.bytes[15], 1);
  const Addr v6 = Parse("2001:db8::1");
  EXPECT_FALSE(v6.v4);
  EXPECT_EQ(v6.bytes[0], 0x20);
  EXPECT_EQ(v6.bytes[15], 1);
  // Written as IPv6, the same client as 192.0.2.1, but said to be IPv6.
  const Addr mapped = Parse("::ffff:192.0.2.1");
  EXPECT_FALSE(mapped.v4);
  EXPECT_EQ(std::memcmp(mapped.bytes, v4.bytes, 16), 0);
  uint8_t untouched[16];
  std::memset(untouched, 0x5a, sizeof(untouched));
  bool flag = true;
  for (const char* bad : {"", "1.2.3", "192.0.2.1/24", "[::1]", "::1%lo",
                          "2001:db8:::1", "256.0.0.1", " 1.2.3.4",
                          "0123456789012345678901234567890123456789012345"}) {
    EXPECT_FALSE(ParseAddress16(bad, untouched, &flag)) << bad;
  }
  for (const uint8_t b : untouched) EXPECT_EQ(b, 0x5a) << "nothing written";
  EXPECT_TRUE(flag);
}

TEST(AddressTest, TakesSocketAddressesOfEitherFamilyWithTheirPort) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(4711);
  ASSERT_EQ(inet_pton(AF_INET, "192.0.2.1", &in.sin_addr), 1);
  uint8_t addr[16];
  uint16_t port = 0;
  ASSERT_TRUE(ToAddress16(reinterpret_cast<const sockaddr*>(&in), sizeof(in),
                          addr, &port));
  EXPECT_EQ(port, 4711);
  EXPECT_EQ(std::memcmp(addr, Parse("192.0.2.1").bytes, 16), 0);

  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(443);
  ASSERT_EQ(inet_pton(AF_INET6, "2001:db8::7", &in6.sin6_addr), 1);
  // At an odd offset: the caller's buffer may be unaligned.
  alignas(8) char buf[sizeof(in6) + 1];
  std::memcpy(buf + 1, &in6, sizeof(in6));
  ASSERT_TRUE(ToAddress16(reinterpret_cast<const sockaddr*>(buf + 1),
                          sizeof(in6), addr, &port));
  EXPECT_EQ(port, 443);
  EXPECT_EQ(std::memcmp(addr, Parse("2001:db8::7").bytes, 16), 0);
}

TEST(AddressTest, RefusesOtherFamiliesAndShortAddressesWritingNothing) {
  uint8_t addr[16];
  std::memset(addr, 0x5a, sizeof(addr));
  uint16_t port = 7;
  sockaddr_in in{};
  in.sin_family = AF_INET;
  EXPECT_FALSE(ToAddress16(reinterpret_cast<const sockaddr*>(&in),
                           sizeof(in) - 1, addr, &port));
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  EXPECT_FALSE(ToAddress16(reinterpret_cast<const sockaddr*>(&in6),
                           sizeof(sockaddr_in), addr, &port));
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  EXPECT_FALSE(ToAddress16(reinterpret_cast<const sockaddr*>(&un), sizeof(un),
                           addr, &port));
  EXPECT_FALSE(ToAddress16(nullptr, sizeof(in6), addr, &port));
  EXPECT_FALSE(
      ToAddress16(reinterpret_cast<const sockaddr*>(&in), 1, addr, &port));
  for (const uint8_t b : addr) EXPECT_EQ(b, 0x5a);
  EXPECT_EQ(port, 7);
}

TEST(AddressTest, MasksAfterThePrefix) {
  Addr a = Parse("192.0.2.129");
  MaskAddress(a.bytes + 12, 4, 24);
  EXPECT_EQ(FormatAddress16(a.bytes), "192.0.2.0");
  a = Parse("192.0.2.129");
  MaskAddress(a.bytes + 12, 4, 25);
  EXPECT_EQ(FormatAddress16(a.bytes), "192.0.2.128");
  a = Parse("192.0.2.129");
  MaskAddress(a.bytes + 12, 4, 32);
  EXPECT_EQ(FormatAddress16(a.bytes), "192.0.2.129");
  MaskAddress(a.bytes + 12, 4, 0);
  EXPECT_EQ(FormatAddress16(a.bytes), "0.0.0.0");
  Addr b = Parse("2001:db8:ffff:ffff::1");
  MaskAddress(b.bytes, 16, 36);
  EXPECT_EQ(FormatAddress16(b.bytes), "2001:db8:f000::");
  b = Parse("2001:db8::1");
  MaskAddress(b.bytes, 16, -5);
  EXPECT_EQ(FormatAddress16(b.bytes), "::");
}

TEST(AddressTest, ComparesPrefixesToTheBit) {
  const Addr a = Parse("192.0.2.1");
  const Addr b = Parse("192.0.3.1");
  EXPECT_TRUE(SamePrefix(a.bytes, b.bytes, kV4MappedBits + 23));
  EXPECT_FALSE(SamePrefix(a.bytes, b.bytes, kV4MappedBits + 24));
  EXPECT_TRUE(SamePrefix(a.bytes, b.bytes, 0));
  EXPECT_TRUE(SamePrefix(a.bytes, a.bytes, 128));
  EXPECT_TRUE(SamePrefix(a.bytes, a.bytes, 999)) << "clamped to 128";
  const Addr c = Parse("2001:db8::");
  const Addr d = Parse("2001:db9::");
  EXPECT_TRUE(SamePrefix(c.bytes, d.bytes, 31));
  EXPECT_FALSE(SamePrefix(c.bytes, d.bytes, 32));
}

TEST(AddressTest, ClampsPrefixLengths) {
  EXPECT_EQ(ClampPrefixBits(-1, kV4Bits), 0);
  EXPECT_EQ(ClampPrefixBits(24, kV4Bits), 24);
  EXPECT_EQ(ClampPrefixBits(33, kV4Bits), 32);
  EXPECT_EQ(ClampPrefixBits(129, kV6Bits), 128);
}

TEST(AddressTest, FormatsAsOperatorsWriteThem) {
  EXPECT_EQ(FormatAddress16(Parse("192.0.2.1").bytes), "192.0.2.1");
  EXPECT_EQ(FormatAddress16(Parse("2001:db8::1").bytes), "2001:db8::1");
  EXPECT_EQ(FormatAddress16(Parse("::ffff:192.0.2.1").bytes), "192.0.2.1");
  EXPECT_EQ(FormatAddress16(Parse("::ffff:192.0.2.1").bytes, /*v4=*/false),
            "::ffff:192.0.2.1");
  EXPECT_EQ(FormatAddressPort(Parse("192.0.2.1").bytes, 80), "192.0.2.1:80");
  EXPECT_EQ(FormatAddressPort(Parse("2001:db8::1").bytes, 443),
            "[2001:db8::1]:443");
  EXPECT_EQ(FormatAddressPort(Parse("::").bytes, 0), "[::]:0");
}

}  // namespace
}  // namespace trafficrate
