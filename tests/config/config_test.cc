#include "src/config/config.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"

namespace trafficrate {
namespace {

// The names of Variables(), in their order.
std::vector<const char*> VariableNames() {
  std::vector<const char*> names;
  for (const Variable& variable : Variables()) names.push_back(variable.name);
  return names;
}

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A fake environment that also counts lookups, to check that each variable
// is read exactly once.
class FakeEnv {
 public:
  FakeEnv() = default;
  FakeEnv(std::initializer_list<std::pair<const std::string, std::string>> vars)
      : vars_(vars) {}

  void Set(const std::string& name, const std::string& value) {
    vars_[name] = value;
  }

  absl::StatusOr<Config> Parse() {
    return ParseConfig([this](const char* name) -> const char* {
      ++lookups_[name];
      const auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    });
  }

  const std::map<std::string, int>& lookups() const { return lookups_; }

 private:
  std::map<std::string, std::string> vars_;
  std::map<std::string, int> lookups_;
};

void ExpectErrorNaming(const absl::Status& status, const std::string& name) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith(name + ": "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("; use "));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n")));
}

TEST(ParseConfigTest, OnlyRateSetGivesDefaults) {
  FakeEnv env = {{kEnvRate, "500k"}};
  const Config config = env.Parse().value();
  EXPECT_TRUE(config.enabled);
  EXPECT_EQ(config.rate_bytes_per_sec, 500u * 1024);
  EXPECT_EQ(config.key.mode, KeyMode::kPeer);
  EXPECT_EQ(config.key.v4_prefix, 32);
  EXPECT_EQ(config.key.v6_prefix, 128);
  EXPECT_EQ(config.zone_name, "default");
  EXPECT_EQ(config.zone_size_bytes, 1u << 20);
  EXPECT_EQ(config.log, LogTarget::kStderr);
  EXPECT_EQ(config.log_path, "");
  EXPECT_FALSE(config.strict);
  EXPECT_EQ(config.idle_ns, 200'000'000);
  EXPECT_TRUE(config.ports.empty()) << "every port";
  EXPECT_TRUE(config.exempt.empty());
  EXPECT_EQ(config.after_bytes, 0u);
}

// An unset variable reads as its table default: setting that value gives
// the same configuration.
TEST(ParseConfigTest, AnUnsetVariableIsItsDefaultValue) {
  const std::map<std::string, std::string> base = {
      {kEnvRate, "500k"},
      {kEnvCluster, "redis://127.0.0.1"},
      {kEnvClusterSecret, "0123456789abcdef"}};
  FakeEnv unset;
  for (const auto& [name, value] : base) unset.Set(name, value);
  const Config defaults = unset.Parse().value();
  for (const Variable& variable : Variables()) {
    if (*variable.default_value == '\0') continue;
    FakeEnv set;
    for (const auto& [name, value] : base) set.Set(name, value);
    set.Set(variable.name, variable.default_value);
    absl::StatusOr<Config> config = set.Parse();
    ASSERT_TRUE(config.ok()) << variable.name << ": " << config.status();
    EXPECT_EQ(config->key.mode, defaults.key.mode) << variable.name;
    EXPECT_EQ(config->zone_name, defaults.zone_name) << variable.name;
    EXPECT_EQ(config->zone_size_bytes, defaults.zone_size_bytes);
    EXPECT_EQ(config->after_bytes, defaults.after_bytes);
    EXPECT_EQ(config->log, defaults.log);
    EXPECT_EQ(config->strict, defaults.strict);
    EXPECT_EQ(config->idle_ns, defaults.idle_ns);
    EXPECT_EQ(config->share, defaults.share);
    EXPECT_EQ(config->inherited, defaults.inherited);
    EXPECT_EQ(config->shape, defaults.shape);
    EXPECT_EQ(config->cluster_decay_ns, defaults.cluster_decay_ns);
  }
  EXPECT_EQ(FindVariable("TRAFFICRATE_IDLE")->default_value,
            std::string("200ms"));
  EXPECT_EQ(FindVariable("TRAFFICRATE_RAT"), nullptr);
}

TEST(ParseConfigTest, RateUnsetDisablesTheLibrary) {
  FakeEnv env;
  const Config config = env.Parse().value();
  EXPECT_FALSE(config.enabled);
  EXPECT_EQ(config.rate_bytes_per_sec, 0u);
}

TEST(ParseConfigTest, RateUnsetStillValidatesAndKeepsTheRest) {
  FakeEnv env = {{kEnvZone, "web"}, {kEnvKey, "all"}};
  const Config config = env.Parse().value();
  EXPECT_FALSE(config.enabled);
  EXPECT_EQ(config.zone_name, "web");
  EXPECT_EQ(config.key.mode, KeyMode::kAll);

  FakeEnv bad = {{kEnvZoneSize, "1k"}};
  ExpectErrorNaming(bad.Parse().status(), kEnvZoneSize);
}

TEST(ParseConfigTest, EveryVariableIsReadExactlyOnce) {
  FakeEnv env = {{kEnvRate, "1m"}};
  ASSERT_TRUE(env.Parse().ok());
  std::map<std::string, int> want;
  for (const char* name : VariableNames()) want[name] = 1;
  EXPECT_EQ(env.lookups(), want);
}

TEST(ParseConfigTest, AllVariablesSet) {
  FakeEnv env = {{kEnvRate, "2m"},
                 {kEnvKey, "peer/24,64"},
                 {kEnvZone, "site-1.a_b"},
                 {kEnvZoneSize, "32m"},
                 {kEnvLog, "/var/log/tr"},
                 {kEnvStrict, "1"},
                 {kEnvIdle, "1s"},
                 {kEnvPorts, "8000-8099,80"},
                 {kEnvExempt, "10.0.0.0/8, ::1"},
                 {kEnvAfter, "2m"}};
  const Config config = env.Parse().value();
  EXPECT_TRUE(config.enabled);
  EXPECT_EQ(config.rate_bytes_per_sec, 2u << 20);
  EXPECT_EQ(config.key.v4_prefix, 24);
  EXPECT_EQ(config.key.v6_prefix, 64);
  EXPECT_EQ(config.zone_name, "site-1.a_b");
  EXPECT_EQ(config.zone_size_bytes, 32u << 20);
  EXPECT_EQ(config.log, LogTarget::kFile);
  EXPECT_EQ(config.log_path, "/var/log/tr");
  EXPECT_TRUE(config.strict);
  EXPECT_EQ(config.idle_ns, 1'000'000'000);
  EXPECT_EQ(FormatPorts(config.ports), "80,8000-8099");
  ASSERT_EQ(config.exempt.size(), 2u);
  EXPECT_EQ(FormatCidr(config.exempt[0]), "10.0.0.0/8");
  EXPECT_EQ(FormatCidr(config.exempt[1]), "::1");
  EXPECT_EQ(config.after_bytes, 2u << 20);
}

TEST(ParseConfigTest, ShapeIsOnByDefaultAndTakesZeroOrOne) {
  EXPECT_TRUE(FakeEnv({{kEnvRate, "1m"}}).Parse()->shape);
  EXPECT_FALSE(FakeEnv({{kEnvRate, "1m"}, {kEnvShape, "0"}}).Parse()->shape);
  EXPECT_TRUE(FakeEnv({{kEnvRate, "1m"}, {kEnvShape, "1"}}).Parse()->shape);
  for (const char* value : {"off", "true", "2", " 1"}) {
    ExpectErrorNaming(
        FakeEnv({{kEnvRate, "1m"}, {kEnvShape, value}}).Parse().status(),
        kEnvShape);
  }
}

TEST(ParseConfigTest, VariablesAreReadInTheDocumentedOrder) {
  const std::vector<std::string> want = {
      kEnvRate,          kEnvKey,         kEnvZone,         kEnvZoneSize,
      kEnvPorts,         kEnvExempt,      kEnvAfter,        kEnvLog,
      kEnvStrict,        kEnvIdle,        kEnvShare,        kEnvBurst,
      kEnvInherited,     kEnvShape,       kEnvConfig,       kEnvCluster,
      kEnvClusterSecret, kEnvClusterName, kEnvClusterDecay, kEnvClusterHost};
  std::vector<std::string> seen;
  ASSERT_TRUE(ParseConfig([&](const char* name) -> const char* {
                seen.push_back(name);
                return nullptr;
              }).ok());
  EXPECT_EQ(seen, want);
}

TEST(ParseConfigTest, EachBadVariableIsNamed) {
  const std::pair<const char*, const char*> bad_values[] = {
      {kEnvRate, "5x"},     {kEnvKey, "peers"},    {kEnvZone, "a/b"},
      {kEnvZoneSize, "2g"}, {kEnvLog, "file.log"}, {kEnvStrict, "yes"},
      {kEnvIdle, "5h"},     {kEnvPorts, "80x"},    {kEnvExempt, "abc"},
      {kEnvAfter, "1t"},    {kEnvInherited, "no"},
  };
  for (const auto& [name, value] : bad_values) {
    FakeEnv env = {{kEnvRate, "1m"}};
    env.Set(name, value);
    const absl::Status status = env.Parse().status();
    ExpectErrorNaming(status, name);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::string("\"") + value + "\""));
  }
}

TEST(ParseConfigTest, EachEmptyVariableIsAnError) {
  for (const char* name : VariableNames()) {
    FakeEnv env = {{kEnvRate, "1m"}};
    env.Set(name, "");
    const absl::Status status = env.Parse().status();
    ExpectErrorNaming(status, name);
    EXPECT_THAT(std::string(status.message()),
                StartsWith(std::string(name) + ": empty; use "));
  }
}

TEST(ParseConfigTest, FirstErrorWins) {
  FakeEnv env = {{kEnvRate, "0"}, {kEnvStrict, "2"}};
  ExpectErrorNaming(env.Parse().status(), kEnvRate);
}

TEST(ParseConfigTest, ClusterNeedsItsSecretAndCompanionsNeedTheCluster) {
  FakeEnv no_secret = {{kEnvRate, "1m"}, {kEnvCluster, "redis://127.0.0.1"}};
  const absl::Status missing = no_secret.Parse().status();
  EXPECT_THAT(std::string(missing.message()),
              StartsWith(std::string(kEnvClusterSecret) + ": unset, but "));
  // The first companion set, in the order they are read, is named.
  FakeEnv no_cluster = {
      {kEnvRate, "1m"}, {kEnvClusterHost, "web1"}, {kEnvClusterDecay, "5s"}};
  const absl::Status alone = no_cluster.Parse().status();
  EXPECT_THAT(std::string(alone.message()),
              StartsWith(std::string(kEnvClusterDecay) + ": set, but " +
                         kEnvCluster + " is not"));
}

TEST(ParseConfigTest, ClusterVariables) {
  FakeEnv env = {{kEnvRate, "1m"},
                 {kEnvZone, "web"},
                 {kEnvCluster, "redis://:pw@10.0.0.5:6380/2"},
                 {kEnvClusterSecret, "0123456789abcdef"},
                 {kEnvClusterDecay, "3s"}};
  const Config config = env.Parse().value();
  EXPECT_TRUE(config.cluster);
  EXPECT_EQ(config.cluster_url.host, "10.0.0.5");
  EXPECT_EQ(config.cluster_url.port, 6380);
  EXPECT_EQ(config.cluster_url.db, 2);
  EXPECT_EQ(config.cluster_secret, "0123456789abcdef");
  EXPECT_EQ(config.cluster_name, "web");  // the zone's name by default
  EXPECT_EQ(config.cluster_decay_ns, 3'000'000'000);
  env.Set(kEnvClusterName, "fleet-1");
  EXPECT_EQ(env.Parse().value().cluster_name, "fleet-1");
  EXPECT_EQ(config.cluster_host, "");  // the hostname
  env.Set(kEnvClusterHost, "web1.example");
  EXPECT_EQ(env.Parse().value().cluster_host, "web1.example");
}

TEST(ParseConfigTest, ClusterOffByDefault) {
  FakeEnv env = {{kEnvRate, "1m"}};
  const Config config = env.Parse().value();
  EXPECT_FALSE(config.cluster);
  EXPECT_EQ(config.cluster_decay_ns, kDefaultClusterDecayNs);
}

TEST(ParseConfigTest, ClusterNeedsASecret) {
  FakeEnv env = {{kEnvRate, "1m"}, {kEnvCluster, "redis://127.0.0.1"}};
  const absl::Status status = env.Parse().status();
  ExpectErrorNaming(status, kEnvClusterSecret);
  EXPECT_THAT(std::string(status.message()), HasSubstr("unset"));
}

TEST(ParseConfigTest, ClusterCompanionsNeedTheUrl) {
  const std::pair<const char*, const char*> companions[] = {
      {kEnvClusterSecret, "0123456789abcdef"},
      {kEnvClusterName, "fleet"},
      {kEnvClusterDecay, "1s"},
      {kEnvClusterHost, "web1"}};
  for (const auto& [name, value] : companions) {
    FakeEnv env = {{kEnvRate, "1m"}};
    env.Set(name, value);
    const absl::Status status = env.Parse().status();
    ExpectErrorNaming(status, name);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::string(kEnvCluster) + " is not"));
  }
}

TEST(ParseConfigTest, ClusterSecretIsCheckedAndNeverShown) {
  const std::string bad[] = {"short", "has a space in it here",
                             "tab\tinside-0123456789", std::string(257, 'x')};
  for (const std::string& secret : bad) {
    FakeEnv env = {{kEnvRate, "1m"}, {kEnvCluster, "redis://127.0.0.1"}};
    env.Set(kEnvClusterSecret, secret);
    const absl::Status status = env.Parse().status();
    ExpectErrorNaming(status, kEnvClusterSecret);
    EXPECT_THAT(std::string(status.message()),
                Not(HasSubstr(secret.substr(0, 5))))
        << secret;
  }
}

TEST(ParseConfigTest, ClusterUrlAndDecayErrorsNameTheVariable) {
  const std::string long_host(65, 'h');
  const std::pair<const char*, const char*> bad_values[] = {
      {kEnvCluster, "http://x"},
      {kEnvCluster, "rediss://x"},
      {kEnvCluster, "redis://"},
      {kEnvCluster, "redis://h:0"},
      {kEnvCluster, "redis://h/x"},
      {kEnvClusterDecay, "601s"},
      {kEnvClusterDecay, "soon"},
      {kEnvClusterName, "a/b"},
      {kEnvClusterHost, "a/b"},
      {kEnvClusterHost, "web 1"},
      {kEnvClusterHost, long_host.c_str()}};
  for (const auto& [name, value] : bad_values) {
    FakeEnv env = {{kEnvRate, "1m"},
                   {kEnvCluster, "redis://127.0.0.1"},
                   {kEnvClusterSecret, "0123456789abcdef"}};
    env.Set(name, value);
    const absl::Status status = env.Parse().status();
    ExpectErrorNaming(status, name);
    EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos);
  }
}

TEST(ParseRateTest, Bounds) {
  EXPECT_EQ(ParseRate("1").value(), 1u);
  EXPECT_EQ(ParseRate("1048576m").value(), uint64_t{1} << 40);
  EXPECT_EQ(ParseRate("1073741824k").value(), uint64_t{1} << 40);
  const absl::Status zero = ParseRate("0").status();
  ExpectErrorNaming(zero, kEnvRate);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("below the minimum 1;"));
  const absl::Status high = ParseRate("1048577m").status();
  ExpectErrorNaming(high, kEnvRate);
  EXPECT_THAT(std::string(high.message()),
              HasSubstr("above the maximum 1048576m"));
}

TEST(ParseRateTest, GigaIsRefused) {
  ExpectErrorNaming(ParseRate("1g").status(), kEnvRate);
}

TEST(ParseRateTest, OverflowIsRefused) {
  for (const char* value :
       {"99999999999999999999m", "18446744073709551616", "17592186044416m"}) {
    ExpectErrorNaming(ParseRate(value).status(), kEnvRate);
  }
}

TEST(ParseZoneSizeTest, Bounds) {
  EXPECT_EQ(ParseZoneSize("64k").value(), 64u << 10);
  EXPECT_EQ(ParseZoneSize("1g").value(), 1u << 30);
  EXPECT_EQ(ParseZoneSize("1G").value(), 1u << 30);
  EXPECT_EQ(ParseZoneSize("1024m").value(), 1u << 30);
  ExpectErrorNaming(ParseZoneSize("65535").status(), kEnvZoneSize);
  ExpectErrorNaming(ParseZoneSize("1025m").status(), kEnvZoneSize);
  ExpectErrorNaming(ParseZoneSize("17179869184g").status(), kEnvZoneSize);
}

TEST(ParseIdleNsTest, Bounds) {
  EXPECT_EQ(ParseIdleNs("1ms").value(), 1'000'000);
  EXPECT_EQ(ParseIdleNs("60s").value(), 60'000'000'000);
  EXPECT_EQ(ParseIdleNs("200").value(), 200'000'000);
  ExpectErrorNaming(ParseIdleNs("999us").status(), kEnvIdle);
  ExpectErrorNaming(ParseIdleNs("61s").status(), kEnvIdle);
  ExpectErrorNaming(ParseIdleNs("-1").status(), kEnvIdle);
}

TEST(ParseAfterTest, UnitsAndBounds) {
  EXPECT_EQ(ParseAfter("0").value(), 0u);
  EXPECT_EQ(ParseAfter("1").value(), 1u);
  EXPECT_EQ(ParseAfter("500k").value(), 500u << 10);
  EXPECT_EQ(ParseAfter("2m").value(), 2u << 20);
  EXPECT_EQ(ParseAfter("2M").value(), 2u << 20);
  EXPECT_EQ(ParseAfter("3g").value(), uint64_t{3} << 30);
  EXPECT_EQ(ParseAfter("1024g").value(), uint64_t{1} << 40);
  const absl::Status high = ParseAfter("1025g").status();
  ExpectErrorNaming(high, kEnvAfter);
  EXPECT_THAT(std::string(high.message()),
              HasSubstr("above the maximum 1024g"));
  for (const char* value :
       {"", "-1", "2mb", "1.5m", "2 m", "1t", "99999999999999999999g"}) {
    ExpectErrorNaming(ParseAfter(value).status(), kEnvAfter);
  }
}

TEST(ParseConfigTest, ListErrorsAreOneLineAndNameTheVariable) {
  const std::pair<const char*, const char*> bad_values[] = {
      {kEnvPorts, "0"},
      {kEnvPorts, "65536"},
      {kEnvPorts, "-1"},
      {kEnvPorts, "80,,443"},
      {kEnvExempt, "10.0.0.0/33"},
      {kEnvExempt, "::1/129"},
      {kEnvExempt, "10.0.0.1/"},
      {kEnvExempt, "a\nb"},
  };
  for (const auto& [name, value] : bad_values) {
    FakeEnv env = {{kEnvRate, "1m"}};
    env.Set(name, value);
    ExpectErrorNaming(env.Parse().status(), name);
  }
  // A newline next to an item is a blank; inside one it is escaped.
  FakeEnv newline = {{kEnvExempt, "::1,\n10.0.0.0/8x"}};
  ExpectErrorNaming(newline.Parse().status(), kEnvExempt);
}

TEST(ParseInheritedTest, OnByDefaultZeroTurnsItOff) {
  FakeEnv on = {{kEnvRate, "1m"}};
  EXPECT_TRUE(on.Parse().value().inherited);
  FakeEnv off = {{kEnvRate, "1m"}, {kEnvInherited, "0"}};
  EXPECT_FALSE(off.Parse().value().inherited);
  EXPECT_TRUE(ParseInherited("1").value());
  for (const char* value : {"on", "off", "2", " 0", "true"}) {
    ExpectErrorNaming(ParseInherited(value).status(), kEnvInherited);
  }
}

TEST(ParseStrictTest, OnlyZeroAndOne) {
  EXPECT_FALSE(ParseStrict("0").value());
  EXPECT_TRUE(ParseStrict("1").value());
  for (const char* value : {"", "true", "yes", "01", "1 ", "2", "on"}) {
    ExpectErrorNaming(ParseStrict(value).status(), kEnvStrict);
  }
}

TEST(ParseLogTargetTest, NamedTargetsClearThePath) {
  std::string path = "stale";
  EXPECT_EQ(ParseLogTarget("stderr", &path).value(), LogTarget::kStderr);
  EXPECT_EQ(path, "");
  path = "stale";
  EXPECT_EQ(ParseLogTarget("syslog", &path).value(), LogTarget::kSyslog);
  EXPECT_EQ(path, "");
  EXPECT_EQ(ParseLogTarget("off", &path).value(), LogTarget::kOff);
}

TEST(ParseLogTargetTest, AbsolutePathIsAFile) {
  std::string path;
  EXPECT_EQ(ParseLogTarget("/var/log/trafficrate.log", &path).value(),
            LogTarget::kFile);
  EXPECT_EQ(path, "/var/log/trafficrate.log");
}

TEST(ParseLogTargetTest, OtherValuesAreRefused) {
  std::string path;
  for (const char* value :
       {"", "STDERR", "stdout", "file.log", "./file.log", " /tmp/x"}) {
    ExpectErrorNaming(ParseLogTarget(value, &path).status(), kEnvLog);
  }
}

TEST(ParseZoneNameTest, AcceptsTheDocumentedCharacters) {
  EXPECT_EQ(ParseZoneName("default").value(), "default");
  EXPECT_EQ(ParseZoneName("a").value(), "a");
  EXPECT_EQ(ParseZoneName("Web_1.v-2").value(), "Web_1.v-2");
  EXPECT_EQ(ParseZoneName("-x").value(), "-x");
  EXPECT_EQ(ParseZoneName(std::string(64, 'z')).value(), std::string(64, 'z'));
}

TEST(ParseZoneNameTest, RefusesOthers) {
  for (const std::string& value :
       {std::string(""), std::string(".hidden"), std::string("."),
        std::string("a/b"), std::string("a b"), std::string("zone\n"),
        std::string("caf\xc3\xa9"), std::string(65, 'z')}) {
    ExpectErrorNaming(ParseZoneName(value).status(), kEnvZone);
  }
}

}  // namespace
}  // namespace trafficrate

namespace trafficrate {
namespace {

// A rules file in the test's temporary directory, removed at the end.
class RulesFileOnDisk {
 public:
  explicit RulesFileOnDisk(const std::string& text)
      : path_(absl::StrCat(::testing::TempDir(), "/config_test_rules.",
                           getpid(), ".", ++count_)) {
    std::ofstream(path_) << text;
  }
  ~RulesFileOnDisk() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int count_ = 0;
  std::string path_;
};

TEST(ParseConfigTest, RulesFileGivesTheRulesAndRuleZerosSettings) {
  RulesFileOnDisk file(
      "[internal]\nclients = 10.0.0.0/8\nrate = unlimited\n"
      "[downloads]\nlisten = 80\nkey = peer/24\nrate = 500k\nburst = 64k\n"
      "[api]\nlisten = 8443\nrate = 2m\nafter = 1m\n");
  FakeEnv env = {{kEnvConfig, file.path()}, {kEnvShare, "budget"}};
  absl::StatusOr<Config> config = env.Parse();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->enabled);
  EXPECT_EQ(config->rules_path, file.path());
  ASSERT_EQ(config->rules.size(), 3u);
  EXPECT_EQ(config->rules[2].name, "api");
  // The zone's rule 0 is the first rule with a rate.
  EXPECT_EQ(config->rate_bytes_per_sec, 500u << 10);
  EXPECT_EQ(config->key.v4_prefix, 24);
  EXPECT_EQ(config->burst_bytes, 64u << 10);
  EXPECT_EQ(config->share, ShareMode::kBudget);
}

TEST(ParseConfigTest, RulesFileWithEveryRuleUnlimitedGovernsNothing) {
  RulesFileOnDisk file("[all]\nrate = unlimited\n");
  FakeEnv env = {{kEnvConfig, file.path()}};
  absl::StatusOr<Config> config = env.Parse();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->enabled);
}

TEST(ParseConfigTest, RulesFileErrorsNameTheVariableAndTheFile) {
  RulesFileOnDisk file("[a]\nrate = 1m\n");
  for (const char* name :
       {kEnvRate, kEnvKey, kEnvPorts, kEnvExempt, kEnvAfter, kEnvBurst}) {
    FakeEnv env = {{kEnvConfig, file.path()}};
    env.Set(name, name == kEnvRate || name == kEnvAfter || name == kEnvBurst
                      ? "1m"
                  : name == kEnvKey   ? "peer"
                  : name == kEnvPorts ? "80"
                                      : "10.0.0.1");
    const absl::Status status = env.Parse().status();
    EXPECT_THAT(
        std::string(status.message()),
        StartsWith(absl::StrCat(kEnvConfig, ": ", name, " is set too; ")))
        << name;
  }
  FakeEnv relative = {{kEnvConfig, "rules.conf"}};
  ExpectErrorNaming(relative.Parse().status(), kEnvConfig);
  FakeEnv missing = {{kEnvConfig, "/nonexistent/rules.conf"}};
  EXPECT_EQ(std::string(missing.Parse().status().message()),
            "TRAFFICRATE_CONFIG: open /nonexistent/rules.conf: No such file "
            "or directory");
  RulesFileOnDisk bad("[a]\nrate = 1m\nrat = 2\n");
  FakeEnv env = {{kEnvConfig, bad.path()}};
  EXPECT_THAT(std::string(env.Parse().status().message()),
              StartsWith(absl::StrCat(kEnvConfig, ": ", bad.path(),
                                      ":3:1: unknown field \"rat\"")));
}

}  // namespace
}  // namespace trafficrate
