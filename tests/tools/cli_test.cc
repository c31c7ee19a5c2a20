// Option parsing of the trafficrate CLI (tools/cli.h).

#include "tools/cli.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/shm/zone_layout.h"

namespace trafficrate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr OptionSpec kSpecs[] = {
    {"--rate", true}, {"--zone", true}, {"--json", false}, {"--strict", false}};

TEST(ParseArgsTest, ValuesSeparateOrAfterEquals) {
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--rate", "500k", "--zone=web"}, kSpecs, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Get("--rate", ""), "500k");
  EXPECT_EQ(p->Get("--zone", ""), "web");
  EXPECT_FALSE(p->Has("--json"));
  EXPECT_EQ(p->Get("--json", "fallback"), "fallback");
}

TEST(ParseArgsTest, SwitchesAndPositionals) {
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"1m", "--json", "x"}, kSpecs, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Has("--json"));
  EXPECT_THAT(p->positional, ElementsAre("1m", "x"));
}

TEST(ParseArgsTest, EverythingAfterDoubleDashIsTheCommand) {
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--rate", "1m", "--", "nginx", "-g", "daemon off;", "--rate"},
                kSpecs, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Get("--rate", ""), "1m");
  EXPECT_THAT(p->command, ElementsAre("nginx", "-g", "daemon off;", "--rate"));
}

TEST(ParseArgsTest, DoubleDashIsAnOptionErrorWhereNoCommandIsTaken) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--", "x"}, kSpecs, false);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("unknown option \"--\""));
}

TEST(ParseArgsTest, HelpIsRecognizedAnywhere) {
  for (const char* flag : {"--help", "-h"}) {
    absl::StatusOr<ParsedArgs> p = ParseArgs({"--json", flag}, kSpecs, false);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->help) << flag;
  }
}

TEST(ParseArgsTest, UnknownOptionIsAnError) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--rat", "1"}, kSpecs, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "unknown option \"--rat\"");
}

TEST(ParseArgsTest, MissingValueIsAnError) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--rate"}, kSpecs, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "--rate needs a value");
}

TEST(ParseArgsTest, AnOptionWhereAValueBelongsIsAMissingValue) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--zone", "--json"}, kSpecs, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "--zone needs a value before --json (write --zone=VALUE for a "
            "value that starts with -)");
  p = ParseArgs({"--rate", "--help"}, kSpecs, false);
  EXPECT_FALSE(p.ok());
  // Given with '=', such a value is taken as it is.
  p = ParseArgs({"--zone=--json"}, kSpecs, false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Get("--zone", ""), "--json");
  // A value that is not one of the options is a value.
  p = ParseArgs({"--zone", "-x"}, kSpecs, false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Get("--zone", ""), "-x");
}

TEST(ParseArgsTest, SwitchWithValueIsAnError) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--json=yes"}, kSpecs, false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "--json takes no value");
}

TEST(ParseArgsTest, EmptyValueIsKeptForTheConfigParserToRefuse) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--rate="}, kSpecs, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Has("--rate"));
  EXPECT_EQ(p->Get("--rate", "x"), "");
}

TEST(ConfigEnvironmentTest, OptionsOverrideTheEnvironment) {
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--rate", "1m", "--strict"}, kSpecs, false);
  ASSERT_TRUE(p.ok());
  const std::map<std::string, std::string> env = ConfigEnvironment(
      *p, {{"TRAFFICRATE_RATE", "500k"}, {"TRAFFICRATE_ZONE", "web"}});
  EXPECT_EQ(env.at("TRAFFICRATE_RATE"), "1m");
  EXPECT_EQ(env.at("TRAFFICRATE_ZONE"), "web") << "kept";
  EXPECT_EQ(env.at("TRAFFICRATE_STRICT"), "1");
  EXPECT_EQ(env.count("TRAFFICRATE_KEY"), 0u);
}

TEST(ConfigEnvironmentTest, NoInheritedTurnsInheritedSocketsOff) {
  constexpr OptionSpec kInherited[] = {{"--rate", true},
                                       {"--no-inherited", false}};
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--rate", "1m", "--no-inherited"}, kInherited, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ConfigEnvironment(*p, {{"TRAFFICRATE_INHERITED", "1"}})
                .at("TRAFFICRATE_INHERITED"),
            "0");
  p = ParseArgs({"--rate", "1m"}, kInherited, false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ConfigEnvironment(*p, {}).count("TRAFFICRATE_INHERITED"), 0u)
      << "the default (1) is the library's";
}

TEST(ConfigEnvironmentTest, EveryConfigOptionSetsItsVariable) {
  constexpr OptionSpec kAll[] = {
      {"--rate", true},      {"--key", true},    {"--zone", true},
      {"--zone-size", true}, {"--idle", true},   {"--log", true},
      {"--ports", true},     {"--exempt", true}, {"--after", true}};
  absl::StatusOr<ParsedArgs> p =
      ParseArgs({"--rate=1", "--key=2", "--zone=3", "--zone-size=4", "--idle=5",
                 "--log=6", "--ports=7", "--exempt=8", "--after=9"},
                kAll, false);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::map<std::string, std::string> env = ConfigEnvironment(*p, {});
  EXPECT_EQ(env,
            (std::map<std::string, std::string>{{"TRAFFICRATE_RATE", "1"},
                                                {"TRAFFICRATE_KEY", "2"},
                                                {"TRAFFICRATE_ZONE", "3"},
                                                {"TRAFFICRATE_ZONE_SIZE", "4"},
                                                {"TRAFFICRATE_IDLE", "5"},
                                                {"TRAFFICRATE_LOG", "6"},
                                                {"TRAFFICRATE_PORTS", "7"},
                                                {"TRAFFICRATE_EXEMPT", "8"},
                                                {"TRAFFICRATE_AFTER", "9"}}));
}

TEST(ForOptionsTest, NamesTheOptionThatSetTheBadValue) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--rate", "12x"}, kSpecs, false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(ForOptions(*p, "TRAFFICRATE_RATE: \"12x\" is not a byte count"),
            "--rate: \"12x\" is not a byte count");
  EXPECT_EQ(ForOptions(*p, "TRAFFICRATE_ZONE: bad"), "TRAFFICRATE_ZONE: bad")
      << "from the environment, not from an option";
}

}  // namespace
}  // namespace trafficrate

namespace trafficrate {
namespace {

TEST(VersionTextTest, NamesVersionLayoutFeaturesAndBuild) {
  const std::string text = VersionText();
  EXPECT_THAT(text,
              ::testing::StartsWith(std::string("trafficrate ") +
                                    TRAFFICRATE_VERSION + "\nzone layout " +
                                    std::to_string(kZoneLayoutVersion) + " "));
  EXPECT_THAT(text, HasSubstr("\nfeatures: shares equal and budget; rules "
                              "files (TRAFFICRATE_CONFIG) with reload;"));
  EXPECT_THAT(text, HasSubstr("\nbuild: "));
  EXPECT_THAT(text, HasSubstr(", sanitizers "));
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace trafficrate
