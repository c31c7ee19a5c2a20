#include "src/config/rules_file.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/config/rules.h"
#include "src/net/key.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

// An address as the Governor sees it: IPv6, IPv4 as IPv4-mapped.
struct Addr16 {
  uint8_t bytes[16] = {};
};
Addr16 A(const char* text) {
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

RulesFile Parse(const std::string& text) {
  absl::StatusOr<RulesFile> file = ParseRulesText("t.rules", text);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? *file : RulesFile{};
}

// The error of a file that must not parse: one line, at path:line:column.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<RulesFile> file = ParseRulesText("t.rules", text);
  EXPECT_FALSE(file.ok()) << text;
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(file.status().message());
  EXPECT_THAT(message, Not(HasSubstr("\n")));
  return message;
}

int Match(const RulesFile& file, const char* local, uint16_t port,
          const char* peer) {
  return FirstMatchingRule(file.rules, A(local).bytes, port, A(peer).bytes);
}

TEST(RulesFileTest, ParsesEveryFieldWithCommentsAndBlanks) {
  const RulesFile file = Parse(
      "# downloads and an API\n"
      "\n"
      "[downloads]\n"
      "listen  = 80, 8000-8099 , 127.0.0.1:81  # trailing comment\n"
      "clients = 0.0.0.0/0, ::/0\n"
      "exempt  = 192.0.2.7\n"
      "key     = peer/24,64\n"
      "rate    = 500k\n"
      "after   = 1m\n"
      "burst   = 64k\n"
      "; another comment style\n"
      "[api]\r\n"
      "\tlisten = [::1]:8443\r\n"
      "rate = 2m\r\n");
  ASSERT_THAT(file.rules, SizeIs(2));
  const Rule& d = file.rules[0];
  EXPECT_EQ(d.name, "downloads");
  EXPECT_EQ(d.line, 3);
  ASSERT_THAT(d.listen, SizeIs(3));
  EXPECT_TRUE(d.listen[0].any_address);
  EXPECT_EQ(d.listen[0].ports, (PortRange{80, 80}));
  EXPECT_EQ(d.listen[1].ports, (PortRange{8000, 8099}));
  EXPECT_FALSE(d.listen[2].any_address);
  EXPECT_EQ(FormatListenEntry(d.listen[2]), "127.0.0.1:81");
  ASSERT_THAT(d.clients, SizeIs(2));
  ASSERT_THAT(d.exempt, SizeIs(1));
  EXPECT_EQ(FormatCidr(d.exempt[0]), "192.0.2.7");
  EXPECT_EQ(d.key.mode, KeyMode::kPeer);
  EXPECT_EQ(d.key.v4_prefix, 24);
  EXPECT_EQ(d.key.v6_prefix, 64);
  EXPECT_FALSE(d.unlimited);
  EXPECT_EQ(d.rate_bytes_per_sec, 500u << 10);
  EXPECT_EQ(d.after_bytes, 1u << 20);
  EXPECT_EQ(d.burst_bytes, 64u << 10);
  const Rule& api = file.rules[1];
  EXPECT_EQ(api.name, "api");
  EXPECT_EQ(api.line, 12);
  ASSERT_THAT(api.listen, SizeIs(1));
  EXPECT_EQ(FormatListenEntry(api.listen[0]), "[::1]:8443");
  EXPECT_EQ(api.rate_bytes_per_sec, 2u << 20);
}

TEST(RulesFileTest, DefaultsAreEveryEndpointEveryClientPeerNoAfter) {
  const RulesFile file = Parse("[all]\nrate = 1\n");
  ASSERT_THAT(file.rules, SizeIs(1));
  const Rule& r = file.rules[0];
  EXPECT_THAT(r.listen, SizeIs(0));
  EXPECT_THAT(r.clients, SizeIs(0));
  EXPECT_THAT(r.exempt, SizeIs(0));
  EXPECT_EQ(r.key.mode, KeyMode::kPeer);
  EXPECT_EQ(r.key.v4_prefix, 32);
  EXPECT_EQ(r.rate_bytes_per_sec, 1u);
  EXPECT_EQ(r.after_bytes, 0u);
  EXPECT_EQ(r.burst_bytes, 0u);
}

TEST(RulesFileTest, RateUnlimitedAndEveryKeyForm) {
  const RulesFile file = Parse(
      "[a]\nrate = unlimited\n[b]\nkey = local\nrate = 1m\n"
      "[c]\nkey = all\nrate = 1048576m\n[d]\nkey=peer\nrate=3\n");
  ASSERT_THAT(file.rules, SizeIs(4));
  EXPECT_TRUE(file.rules[0].unlimited);
  EXPECT_EQ(file.rules[1].key.mode, KeyMode::kLocal);
  EXPECT_EQ(file.rules[2].key.mode, KeyMode::kAll);
  EXPECT_EQ(file.rules[2].rate_bytes_per_sec, uint64_t{1} << 40);
  EXPECT_EQ(file.rules[3].rate_bytes_per_sec, 3u);
}

TEST(RulesFileTest, EveryListenForm) {
  const RulesFile file = Parse(
      "[r]\nrate = 1k\nlisten = 80, 8000-8099, 127.0.0.1:80, [::1]:8080, "
      "127.0.0.1:8000-8099, *:81, 127.0.0.2, [::1], [::]:82, 0.0.0.0:83, *, "
      "[2001:db8::1]:1-65535, [::0]:84, 0.0.0.0\n");
  ASSERT_THAT(file.rules, SizeIs(1));
  std::vector<std::string> shown;
  for (const ListenEntry& e : file.rules[0].listen) {
    shown.push_back(FormatListenEntry(e));
  }
  EXPECT_THAT(shown,
              ElementsAre("80", "8000-8099", "127.0.0.1:80", "[::1]:8080",
                          "127.0.0.1:8000-8099", "81", "127.0.0.2", "[::1]",
                          "82", "83", "*:*", "[2001:db8::1]", "84", "*:*"));
  // Each shown form parses back to the same entry.
  for (size_t i = 0; i < shown.size(); ++i) {
    const RulesFile again =
        Parse(absl::StrCat("[r]\nrate = 1k\nlisten = ", shown[i], "\n"));
    ASSERT_THAT(again.rules, SizeIs(1));
    ASSERT_THAT(again.rules[0].listen, SizeIs(1));
    EXPECT_EQ(again.rules[0].listen[0], file.rules[0].listen[i]) << shown[i];
  }
}

TEST(RulesFileTest, ErrorsNameFileLineAndColumn) {
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nrat = 2k\n"),
              StartsWith("t.rules:3:1: unknown field \"rat\"; a rule has "
                         "listen, clients, exempt, key, rate, after or burst"));
  EXPECT_THAT(ErrorOf("[a]\nrate =  5x\n"),
              StartsWith("t.rules:2:9: rate: \"5x\" is not a byte count"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 5x\n"), HasSubstr(", or unlimited"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nclients = 10.0.0.0/8, 10.0.0.300\n"),
              StartsWith("t.rules:3:23: clients: \"10.0.0.300\" is not an IP "
                         "address or network; use a comma-separated list"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nexempt = 10.0.0.0/33\n"),
              StartsWith("t.rules:3:10: exempt: \"10.0.0.0/33\" has a bad "
                         "prefix length"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 80,,81\n"),
              StartsWith("t.rules:3:13: listen: empty item"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 80, 0\n"),
              StartsWith("t.rules:3:14: listen: \"0\" is outside 1..65535"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 70000\n"),
              StartsWith("t.rules:3:10: listen: \"70000\" is outside"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 90-80\n"),
              StartsWith("t.rules:3:10: listen: \"90-80\" ends before it "
                         "starts"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = ::1:80\n"),
              StartsWith("t.rules:3:10: listen: \"::1:80\": write an IPv6 "
                         "address in brackets"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = [::1:80\n"),
              StartsWith("t.rules:3:10: listen: \"::1:80\" has no closing ]"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 10.0.0.0/8:80\n"),
              StartsWith("t.rules:3:10: listen: \"10.0.0.0/8\" is a network"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nlisten = 127.0.0.1:\n"),
              StartsWith("t.rules:3:10: listen: \"127.0.0.1:\" has no port"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nkey = peer/33\n"),
              StartsWith("t.rules:3:7: key: \"peer/33\" is not a key; use "
                         "peer, peer/N or peer/N,M"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nburst = 1\n"),
              StartsWith("t.rules:3:9: burst: "));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nafter = -1\n"),
              StartsWith("t.rules:3:9: after: "));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\nrate = 2k\n"),
              StartsWith("t.rules:3:1: rate again in rule \"a\""));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\n[a]\nrate = 2k\n"),
              StartsWith("t.rules:3:1: rule \"a\" again (line 1)"));
  EXPECT_THAT(ErrorOf("rate = 1k\n[a]\n"),
              StartsWith("t.rules:1:1: a field before the first rule"));
  EXPECT_THAT(ErrorOf("[a]\nlisten = 80\n[b]\nrate = 1k\n"),
              StartsWith("t.rules:1:1: rule \"a\" has no rate"));
  EXPECT_THAT(ErrorOf("[a]\nrate = 1k\n[b]\n"),
              StartsWith("t.rules:3:1: rule \"b\" has no rate"));
  EXPECT_THAT(ErrorOf("[a]\nrate =\n"),
              StartsWith("t.rules:2:7: rate: empty value"));
  EXPECT_THAT(ErrorOf("[a]\n  rate 1k\n"),
              StartsWith("t.rules:2:3: \"rate 1k\" is not FIELD = VALUE"));
  EXPECT_THAT(ErrorOf("  [a b]\nrate = 1k\n"),
              StartsWith("t.rules:1:3: \"a b\" is not a rule name"));
  EXPECT_THAT(ErrorOf("[a\nrate = 1k\n"),
              StartsWith("t.rules:1:1: \"[a\" is not a section header"));
  EXPECT_THAT(ErrorOf("[]\nrate = 1k\n"),
              StartsWith("t.rules:1:1: \"\" is not a rule name"));
  EXPECT_THAT(ErrorOf(absl::StrCat("[", std::string(32, 'x'), "]\nrate=1\n")),
              HasSubstr("is not a rule name"));
  EXPECT_THAT(ErrorOf(""), StartsWith("t.rules:1:1: no rules"));
  EXPECT_THAT(ErrorOf("# only a comment\n\n"),
              StartsWith("t.rules:2:1: no rules"));
  EXPECT_THAT(ErrorOf(std::string("[a]\nrate = 1k\x00\n", 15)),
              StartsWith("t.rules:2:10: a NUL byte"));
  EXPECT_THAT(
      ErrorOf(absl::StrCat("[a]\nrate = 1k\n#", std::string(5000, 'x'))),
      StartsWith("t.rules:3:1: line longer than 4096 bytes"));
}

TEST(RulesFileTest, LimitsOnRulesAndItems) {
  std::string many;
  for (int i = 0; i <= kMaxRules; ++i)
    absl::StrAppend(&many, "[r", i, "]\nrate=1\n");
  EXPECT_THAT(ErrorOf(many),
              StartsWith(absl::StrCat("t.rules:", 2 * kMaxRules + 1,
                                      ":1: more than 16 rules")));
  std::string clients = "[a]\nrate = 1\nclients = 10.0.0.1";
  for (int i = 2; i <= kMaxClientEntries + 1; ++i) {
    absl::StrAppend(&clients, ", 10.0.0.", i);
  }
  EXPECT_THAT(ErrorOf(clients), HasSubstr("clients: more than 64 items"));
  EXPECT_THAT(ErrorOf(std::string(kMaxRulesFileBytes + 1, '#')),
              HasSubstr("larger than 1 MiB"));
}

TEST(RulesFileTest, FirstMatchingRuleWins) {
  const RulesFile file = Parse(
      "[internal]\nclients = 10.0.0.0/8, fd00::/8\nrate = unlimited\n"
      "[downloads]\nlisten = 80, 8000-8099\nrate = 500k\n"
      "[api]\nlisten = 127.0.0.1:8443, [::1]:8443\nkey = peer/24\nrate = 1m\n"
      "[rest]\nrate = 2m\n");
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "10.1.2.3"), 0);
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "fd00::5"), 0);
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "11.0.0.1"), 1);
  EXPECT_EQ(Match(file, "::1", 8099, "2001:db8::1"), 1);
  EXPECT_EQ(Match(file, "127.0.0.1", 8100, "11.0.0.1"), 3);
  EXPECT_EQ(Match(file, "127.0.0.1", 8443, "11.0.0.1"), 2);
  EXPECT_EQ(Match(file, "::1", 8443, "2001:db8::1"), 2);
  EXPECT_EQ(Match(file, "127.0.0.2", 8443, "11.0.0.1"), 3);
  const RulesFile no_rest = Parse("[a]\nlisten = 80\nrate = 1k\n");
  EXPECT_EQ(Match(no_rest, "127.0.0.1", 81, "11.0.0.1"), -1);
}

TEST(RulesFileTest, MatchingEdgeCases) {
  const RulesFile file = Parse(
      "[one]\nclients = 192.0.2.7/32, 2001:db8::7/128\nrate = 1k\n"
      "[wide]\nclients = 192.0.2.0/24\nrate = 2k\n"
      "[v6all]\nclients = ::/0\nrate = 3k\n"
      "[v4all]\nclients = 0.0.0.0/0\nrate = 4k\n"
      "[mapped]\nclients = ::ffff:0:0/96\nrate = 5k\n"
      "[edge]\nlisten = 1, 65535, 100-200\nrate = 6k\n");
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "192.0.2.7"), 0);
  EXPECT_EQ(Match(file, "::1", 80, "2001:db8::7"), 0);
  EXPECT_EQ(Match(file, "::1", 80, "2001:db8::8"), 2);
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "192.0.2.8"), 1);
  // An IPv4 network matches an IPv4 client however its socket shows it
  // (A() gives the mapped form a dual-stack socket reports); ::/0 does not.
  EXPECT_EQ(Match(file, "127.0.0.1", 80, "198.51.100.1"), 3);
  // A network inside ::ffff:0:0/96 is an IPv4 one.
  const RulesFile mapped = Parse("[m]\nclients = ::ffff:0:0/96\nrate = 1k\n");
  EXPECT_EQ(Match(mapped, "127.0.0.1", 80, "198.51.100.1"), 0);
  EXPECT_EQ(Match(mapped, "::1", 80, "2001:db8::1"), -1);
  const RulesFile ports = Parse("[p]\nlisten = 1, 65535, 100-200\nrate = 1k\n");
  for (const uint16_t port : {1, 65535, 100, 150, 200}) {
    EXPECT_EQ(Match(ports, "127.0.0.1", port, "10.0.0.1"), 0) << port;
  }
  for (const uint16_t port : {2, 65534, 99, 201}) {
    EXPECT_EQ(Match(ports, "127.0.0.1", port, "10.0.0.1"), -1) << port;
  }
  // A local IPv4 address matches the v4-mapped local address of a
  // dual-stack socket, and "[::]" means every local address.
  const RulesFile local = Parse(
      "[v4]\nlisten = 127.0.0.5:80\nrate = 1k\n"
      "[any]\nlisten = [::]:80\nrate = 2k\n");
  EXPECT_EQ(Match(local, "127.0.0.5", 80, "10.0.0.1"), 0);
  EXPECT_EQ(Match(local, "127.0.0.6", 80, "10.0.0.1"), 1);
  EXPECT_EQ(Match(local, "::1", 80, "::1"), 1);
}

TEST(RulesFileTest, ShadowedRulesNameBothRules) {
  const RulesFile file = Parse(
      "[all]\nlisten = 80\nrate = 1m\n"  // line 1
      "[narrow]\nlisten = 127.0.0.1:80\nclients = 10.0.0.0/8\nrate = 2m\n"
      "[other-port]\nlisten = 81\nrate = 3m\n"  // line 8
      "[internal]\nclients = 10.0.0.0/8\nrate = unlimited\n"
      "[internal2]\nclients = 10.1.0.0/16\nlisten = 81\nrate = 1k\n");
  EXPECT_THAT(ShadowedRules(file),
              ElementsAre("rule \"narrow\" (line 4) can never match: rule "
                          "\"all\" (line 1) comes first and matches every "
                          "connection it would",
                          HasSubstr("rule \"internal2\" (line 14) can never "
                                    "match: rule \"other-port\" (line 8)")));
  // Narrower first, wider after: both can match.
  EXPECT_THAT(ShadowedRules(Parse("[a]\nclients = 10.0.0.0/8\nrate = 1\n"
                                  "[b]\nrate = 2\n")),
              SizeIs(0));
  // An IPv6 catch-all does not cover IPv4 clients.
  EXPECT_THAT(ShadowedRules(Parse("[a]\nclients = ::/0\nrate = 1\n"
                                  "[b]\nclients = 10.0.0.0/8\nrate = 2\n")),
              SizeIs(0));
}

TEST(RulesFileTest, FormatRulesSpellsOutDefaults) {
  const std::string shown = FormatRules(
      Parse("[downloads]\nlisten = 80\nrate = 500k\n[internal]\nclients = "
            "10.0.0.0/8\nrate = unlimited\n"));
  EXPECT_THAT(shown, HasSubstr("1. [downloads] (line 1)\n  listen   80\n"
                               "  clients  every client\n"));
  EXPECT_THAT(shown, HasSubstr("  key      peer\n  rate     500k (512000 "
                               "bytes/s)\n  after    0\n  burst    default"));
  EXPECT_THAT(shown,
              HasSubstr("2. [internal] (line 4)\n  listen   every "
                        "local address and port\n  clients  10.0.0.0/8"));
  EXPECT_THAT(shown, HasSubstr("rate     unlimited"));
}

TEST(RulesFileTest, ReadRulesFileNamesThePath) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/rules_file_test." + std::to_string(getpid());
  {
    std::ofstream out(path);
    out << "[a]\nrate = 1k\n";
  }
  absl::StatusOr<RulesFile> file = ReadRulesFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path, path);
  EXPECT_THAT(file->rules, SizeIs(1));
  {
    std::ofstream out(path);
    out << "[a]\nrate = 1q\n";
  }
  file = ReadRulesFile(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()),
              StartsWith(path + ":2:8: rate: "));
  unlink(path.c_str());
  file = ReadRulesFile(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("open " + path + ": No such file"));
  file = ReadRulesFile(dir);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace trafficrate
