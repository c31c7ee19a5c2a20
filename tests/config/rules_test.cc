#include "src/config/rules.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/config/config.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

void ExpectErrorNaming(const absl::Status& status, const std::string& name) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith(name + ": "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("; use "));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n")));
}

PortRange Ports(uint16_t first, uint16_t last) { return {first, last}; }

// A client address as the Governor sees it: IPv6, IPv4 as IPv4-mapped.
struct Addr16 {
  uint8_t bytes[16] = {};
};
Addr16 Client(const char* text) {
  Addr16 a;
  uint8_t v4[4];
  if (inet_pton(AF_INET, text, v4) == 1) {
    a.bytes[10] = 0xff;
    a.bytes[11] = 0xff;
    std::memcpy(a.bytes + 12, v4, 4);
  } else {
    EXPECT_EQ(inet_pton(AF_INET6, text, a.bytes), 1) << text;
  }
  return a;
}

Cidr OneCidr(const char* text) {
  absl::StatusOr<std::vector<Cidr>> parsed = ParseExempt(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed.ok() ? parsed->size() : 0u, 1u) << text;
  return parsed.ok() && !parsed->empty() ? parsed->front() : Cidr{};
}

bool Contains(const char* cidr, const char* client) {
  return CidrContains(OneCidr(cidr), Client(client).bytes);
}

// --- TRAFFICRATE_PORTS

TEST(ParsePortsTest, SinglePortsAndRanges) {
  EXPECT_THAT(ParsePorts("80").value(), ElementsAre(Ports(80, 80)));
  EXPECT_THAT(ParsePorts("1").value(), ElementsAre(Ports(1, 1)));
  EXPECT_THAT(ParsePorts("65535").value(), ElementsAre(Ports(65535, 65535)));
  EXPECT_THAT(ParsePorts("443,80,8000-8099").value(),
              ElementsAre(Ports(80, 80), Ports(443, 443), Ports(8000, 8099)));
  EXPECT_THAT(ParsePorts("1-65535").value(), ElementsAre(Ports(1, 65535)));
  EXPECT_THAT(ParsePorts("8080-8080").value(), ElementsAre(Ports(8080, 8080)));
  EXPECT_THAT(ParsePorts("0080").value(), ElementsAre(Ports(80, 80)));
}

TEST(ParsePortsTest, DuplicatesOverlapsAndNeighboursMerge) {
  EXPECT_THAT(ParsePorts("80,80,80").value(), ElementsAre(Ports(80, 80)));
  EXPECT_THAT(ParsePorts("8000-8099,8050-8200,80").value(),
              ElementsAre(Ports(80, 80), Ports(8000, 8200)));
  EXPECT_THAT(ParsePorts("81,80,82-90").value(), ElementsAre(Ports(80, 90)));
  EXPECT_THAT(ParsePorts("100-200,150").value(), ElementsAre(Ports(100, 200)));
}

TEST(ParsePortsTest, BlanksAroundItemsAreIgnored) {
  EXPECT_THAT(ParsePorts(" 80 ,\t443").value(),
              ElementsAre(Ports(80, 80), Ports(443, 443)));
}

TEST(ParsePortsTest, EmptyValueOrItemIsAnError) {
  for (const char* value : {"", ",", "80,", ",80", "80,,443", " ", "80, ,81"}) {
    const absl::Status status = ParsePorts(value).status();
    ExpectErrorNaming(status, kEnvPorts);
  }
  EXPECT_THAT(std::string(ParsePorts("").status().message()),
              StartsWith("TRAFFICRATE_PORTS: empty; use "));
  EXPECT_THAT(std::string(ParsePorts("80,,443").status().message()),
              HasSubstr("\"80,,443\" has an empty item"));
}

TEST(ParsePortsTest, BadPortsAreRefusedAndQuoted) {
  for (const char* value :
       {"0", "65536", "80x", "-1", "+80", "8o", "80-", "-", "1-2-3", "0-10",
        "65000-70000", "99999999999999999999", "8099-8000", "80 443", "80;443",
        "http"}) {
    const absl::Status status = ParsePorts(value).status();
    ExpectErrorNaming(status, kEnvPorts);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("\"", value, "\"")))
        << value;
  }
  EXPECT_THAT(std::string(ParsePorts("65536").status().message()),
              HasSubstr("outside 1..65535"));
  EXPECT_THAT(std::string(ParsePorts("8099-8000").status().message()),
              HasSubstr("ends before it starts"));
  // The bad item is named, not the whole list.
  EXPECT_THAT(std::string(ParsePorts("80,443,80x").status().message()),
              HasSubstr("TRAFFICRATE_PORTS: \"80x\" is not a port"));
}

TEST(FormatPortsTest, ParsesBack) {
  EXPECT_EQ(FormatPorts({}), "all");
  const std::vector<PortRange> ports = ParsePorts("8000-8099,443,80").value();
  EXPECT_EQ(FormatPorts(ports), "80,443,8000-8099");
  EXPECT_EQ(ParsePorts(FormatPorts(ports)).value(), ports);
}

// --- TRAFFICRATE_EXEMPT

TEST(ParseExemptTest, AddressesAndNetworks) {
  const std::vector<Cidr> list =
      ParseExempt("10.0.0.0/8,127.0.0.3,2001:db8::/32,::1").value();
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[0].family, AF_INET);
  EXPECT_EQ(list[0].prefix, 8);
  const uint8_t ten[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10};
  EXPECT_EQ(std::memcmp(list[0].addr, ten, 16), 0) << "IPv4 is v4-mapped";
  EXPECT_EQ(list[1].family, AF_INET);
  EXPECT_EQ(list[1].prefix, 32);
  EXPECT_EQ(list[2].family, AF_INET6);
  EXPECT_EQ(list[2].prefix, 32);
  EXPECT_EQ(list[3].family, AF_INET6);
  EXPECT_EQ(list[3].prefix, 128);
  EXPECT_EQ(FormatCidr(list[0]), "10.0.0.0/8");
  EXPECT_EQ(FormatCidr(list[1]), "127.0.0.3");
  EXPECT_EQ(FormatCidr(list[2]), "2001:db8::/32");
  EXPECT_EQ(FormatCidr(list[3]), "::1");
}

TEST(ParseExemptTest, HostBitsAreClearedAndDuplicatesKeptOnce) {
  EXPECT_EQ(FormatCidr(OneCidr("10.1.2.3/8")), "10.0.0.0/8");
  EXPECT_EQ(FormatCidr(OneCidr("10.1.2.3/0")), "0.0.0.0/0");
  EXPECT_EQ(FormatCidr(OneCidr("2001:db8:ffff::1/33")), "2001:db8:8000::/33");
  const std::vector<Cidr> list =
      ParseExempt(" 10.0.0.0/8 , 10.9.9.9/8,\t::1, 0::1 ").value();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(FormatCidr(list[0]), "10.0.0.0/8");
  EXPECT_EQ(FormatCidr(list[1]), "::1");
}

TEST(ParseExemptTest, FormatParsesBack) {
  for (const char* text : {"10.0.0.0/8", "127.0.0.3", "2001:db8::/32", "::1",
                           "::ffff:10.0.0.0/104", "0.0.0.0/0", "::/0"}) {
    const Cidr cidr = OneCidr(text);
    EXPECT_EQ(FormatCidr(cidr), text);
    EXPECT_EQ(OneCidr(FormatCidr(cidr).c_str()), cidr) << text;
  }
}

TEST(ParseExemptTest, BadEntriesAreRefusedAndQuoted) {
  for (const char* value :
       {"10.0.0.0/33", "::1/129", "abc", "10.0.0.1/", "10.0.0.1/-1",
        "10.0.0.1/+8", "10.0.0.1/8/8", "10.0.0", "127.1", "256.0.0.1",
        "10.0.0.0 /8", "fe80::1%eth0", "/8", "::1/0128", "1.2.3.4.5",
        "localhost"}) {
    const absl::Status status = ParseExempt(value).status();
    ExpectErrorNaming(status, kEnvExempt);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("\"", value, "\"")))
        << value;
  }
  EXPECT_THAT(std::string(ParseExempt("10.0.0.0/33").status().message()),
              HasSubstr("bad prefix length (0..32 for IPv4)"));
  EXPECT_THAT(std::string(ParseExempt("::1/129").status().message()),
              HasSubstr("bad prefix length (0..128 for IPv6)"));
  EXPECT_THAT(std::string(ParseExempt("::1,abc").status().message()),
              HasSubstr("TRAFFICRATE_EXEMPT: \"abc\" is not an IP address"));
}

TEST(ParseExemptTest, EmptyValueOrItemIsAnError) {
  for (const char* value : {"", ",", "::1,", ",::1", "::1,,10.0.0.0/8", " "}) {
    ExpectErrorNaming(ParseExempt(value).status(), kEnvExempt);
  }
}

TEST(ParseExemptTest, AtMost64Entries) {
  std::string list;
  for (int i = 0; i < kMaxExemptEntries; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : ",", "10.0.", i, ".0/24");
  }
  EXPECT_EQ(ParseExempt(list).value().size(), 64u);
  const absl::Status status = ParseExempt(list + ",::1").status();
  ExpectErrorNaming(status, kEnvExempt);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("65 entries, above the maximum 64"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("at most 64"));
}

TEST(CidrContainsTest, Ipv4Networks) {
  EXPECT_TRUE(Contains("10.0.0.0/8", "10.255.1.2"));
  EXPECT_FALSE(Contains("10.0.0.0/8", "11.0.0.1"));
  EXPECT_TRUE(Contains("127.0.0.3", "127.0.0.3"));
  EXPECT_FALSE(Contains("127.0.0.3", "127.0.0.2"));
  EXPECT_TRUE(Contains("192.168.4.0/22", "192.168.7.255"));
  EXPECT_FALSE(Contains("192.168.4.0/22", "192.168.8.0"));
  EXPECT_TRUE(Contains("0.0.0.0/0", "203.0.113.9"));
  EXPECT_FALSE(Contains("0.0.0.0/0", "::1")) << "IPv4 rules are IPv4 only";
}

TEST(CidrContainsTest, Ipv4RuleMatchesTheMappedFormOfTheAddress) {
  // A dual-stack (AF_INET6) socket shows an IPv4 client as ::ffff:a.b.c.d,
  // which is exactly the Governor's 16-byte form of an AF_INET client.
  sockaddr_in6 dual{};
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.3", &dual.sin6_addr), 1);
  uint8_t mapped[16];
  std::memcpy(mapped, &dual.sin6_addr, 16);
  EXPECT_TRUE(CidrContains(OneCidr("127.0.0.3"), mapped));
  EXPECT_TRUE(CidrContains(OneCidr("127.0.0.0/8"), mapped));
  EXPECT_FALSE(CidrContains(OneCidr("127.0.0.2"), mapped));
  // Written as mapped IPv6, the rule matches the IPv4 client too.
  EXPECT_TRUE(Contains("::ffff:127.0.0.0/104", "127.0.0.3"));
  EXPECT_TRUE(Contains("::ffff:0:0/96", "10.1.2.3"));
}

TEST(CidrContainsTest, Ipv6Networks) {
  EXPECT_TRUE(Contains("2001:db8::/32", "2001:db8:1234::1"));
  EXPECT_FALSE(Contains("2001:db8::/32", "2001:db9::1"));
  EXPECT_TRUE(Contains("::1", "::1"));
  EXPECT_FALSE(Contains("::1", "::2"));
  EXPECT_TRUE(Contains("2001:db8::/33", "2001:db8:7fff::1"));
  EXPECT_FALSE(Contains("2001:db8::/33", "2001:db8:8000::1"));
  EXPECT_TRUE(Contains("::/0", "2001:db8::1"));
  EXPECT_FALSE(Contains("::/0", "10.0.0.1")) << "every IPv6 client only";
}

TEST(AcceptRulesTest, DefaultGovernsEverything) {
  const AcceptRules rules;
  EXPECT_FALSE(rules.restricts_ports());
  EXPECT_TRUE(rules.GovernsPort(1));
  EXPECT_TRUE(rules.GovernsPort(65535));
  EXPECT_FALSE(rules.Exempts(Client("127.0.0.3").bytes));
  EXPECT_EQ(rules.exempt_count(), 0);
}

TEST(AcceptRulesTest, PortBitmapFollowsTheRanges) {
  const AcceptRules rules =
      AcceptRules::Make(ParsePorts("80,8000-8099,65535").value(), {}).value();
  EXPECT_TRUE(rules.restricts_ports());
  for (const uint16_t port : {80, 8000, 8063, 8064, 8099, 65535}) {
    EXPECT_TRUE(rules.GovernsPort(port)) << port;
  }
  for (const uint16_t port : {0, 1, 79, 81, 443, 7999, 8100, 65534}) {
    EXPECT_FALSE(rules.GovernsPort(port)) << port;
  }
  const AcceptRules all =
      AcceptRules::Make(ParsePorts("1-65535").value(), {}).value();
  EXPECT_TRUE(all.GovernsPort(1));
  EXPECT_TRUE(all.GovernsPort(65535));
  EXPECT_FALSE(all.GovernsPort(0));
}

TEST(AcceptRulesTest, ExemptNetworks) {
  const AcceptRules rules =
      AcceptRules::Make({}, ParseExempt("10.0.0.0/8,127.0.0.3,::1").value())
          .value();
  EXPECT_EQ(rules.exempt_count(), 3);
  EXPECT_FALSE(rules.restricts_ports());
  EXPECT_TRUE(rules.Exempts(Client("10.2.3.4").bytes));
  EXPECT_TRUE(rules.Exempts(Client("127.0.0.3").bytes));
  EXPECT_TRUE(rules.Exempts(Client("::1").bytes));
  EXPECT_FALSE(rules.Exempts(Client("127.0.0.2").bytes));
  EXPECT_FALSE(rules.Exempts(Client("2001:db8::1").bytes));
}

TEST(AcceptRulesTest, MoreThan64ExemptionsAreRefused) {
  std::vector<Cidr> many(kMaxExemptEntries + 1, OneCidr("::1"));
  ExpectErrorNaming(AcceptRules::Make({}, many).status(), kEnvExempt);
  many.pop_back();
  EXPECT_EQ(AcceptRules::Make({}, many).value().exempt_count(), 64);
}

}  // namespace
}  // namespace trafficrate
