#include "src/base/units.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kName[] = "TRAFFICRATE_TEST";
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSec = 1'000'000'000;

absl::StatusOr<uint64_t> Bytes(absl::string_view value, bool allow_g = false,
                               uint64_t min = 0, uint64_t max = kMaxU64) {
  return ParseByteCount(kName, value, allow_g, min, max);
}

absl::StatusOr<int64_t> Duration(absl::string_view value) {
  return ParseDurationNs(kName, value, kMs, 60 * kSec);
}

// Every error must be InvalidArgument, start with the variable's name and fit
// on one line, whatever the input.
void ExpectOneLineError(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::StartsWith(std::string(kName) + ": "));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n")));
}

TEST(ParseByteCountTest, PlainDigitsAreBytes) {
  EXPECT_EQ(Bytes("0").value(), 0u);
  EXPECT_EQ(Bytes("1").value(), 1u);
  EXPECT_EQ(Bytes("512000").value(), 512000u);
}

TEST(ParseByteCountTest, LeadingZerosAreAccepted) {
  EXPECT_EQ(Bytes("0500k").value(), 500u * 1024);
}

TEST(ParseByteCountTest, KiloIsTimes1024) {
  EXPECT_EQ(Bytes("500k").value(), 500u * 1024);
  EXPECT_EQ(Bytes("500K").value(), 500u * 1024);
}

TEST(ParseByteCountTest, MegaIsTimes1024Squared) {
  EXPECT_EQ(Bytes("3m").value(), 3u << 20);
  EXPECT_EQ(Bytes("3M").value(), 3u << 20);
}

TEST(ParseByteCountTest, GigaIsTimes1024CubedWhenAllowed) {
  EXPECT_EQ(Bytes("2g", /*allow_g=*/true).value(), uint64_t{2} << 30);
  EXPECT_EQ(Bytes("2G", /*allow_g=*/true).value(), uint64_t{2} << 30);
}

TEST(ParseByteCountTest, GigaIsRefusedWhenNotAllowed) {
  for (const char* value : {"1g", "1G"}) {
    const absl::Status status = Bytes(value).status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("is not a byte count"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("k (x1024) or m"));
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr("g (")));
  }
}

TEST(ParseByteCountTest, LargestValueFits) {
  EXPECT_EQ(Bytes("18446744073709551615").value(), kMaxU64);
  EXPECT_EQ(Bytes("17179869183g", /*allow_g=*/true).value(),
            uint64_t{17179869183} << 30);
}

TEST(ParseByteCountTest, OverflowIsAboveTheMaximum) {
  for (const char* value :
       {"99999999999999999999m", "18446744073709551616", "17179869184g",
        "17592186044416m", "99999999999999999999999999999999999999"}) {
    const absl::Status status = Bytes(value, /*allow_g=*/true).status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("is above the maximum"))
        << value;
  }
}

TEST(ParseByteCountTest, EmptyIsAnError) {
  const absl::Status status = Bytes("").status();
  ExpectOneLineError(status);
  EXPECT_EQ(status.message(),
            "TRAFFICRATE_TEST: empty; use an integer from 0 to "
            "18446744073709551615, optionally followed by k (x1024) or m "
            "(x1024^2)");
}

TEST(ParseByteCountTest, TrailingGarbageIsRefused) {
  for (const char* value :
       {"500kb", "500 k", "500k ", "5x", "5.5k", "5e3", "1kk", "0x10"}) {
    const absl::Status status = Bytes(value).status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()), HasSubstr("is not a byte count"))
        << value;
  }
}

TEST(ParseByteCountTest, LeadingGarbageIsRefused) {
  for (const char* value : {"+5", "-5", " 5", "k", "m", "\t5"}) {
    const absl::Status status = Bytes(value).status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()), HasSubstr("is not a byte count"))
        << value;
  }
}

TEST(ParseByteCountTest, BoundsAreInclusive) {
  EXPECT_EQ(Bytes("64k", true, 64 << 10, 1 << 30).value(), 64u << 10);
  EXPECT_EQ(Bytes("1g", true, 64 << 10, 1 << 30).value(), 1u << 30);
}

TEST(ParseByteCountTest, BelowMinimumNamesTheMinimum) {
  const absl::Status status = Bytes("63k", true, 64 << 10, 1 << 30).status();
  ExpectOneLineError(status);
  EXPECT_EQ(status.message(),
            "TRAFFICRATE_TEST: \"63k\" is below the minimum 64k; use an "
            "integer from 64k to 1g, optionally followed by k (x1024), m "
            "(x1024^2) or g (x1024^3)");
}

TEST(ParseByteCountTest, ZeroIsRefusedWhenMinimumIsOne) {
  const absl::Status status = Bytes("0", false, 1, 100).status();
  ExpectOneLineError(status);
  EXPECT_THAT(std::string(status.message()), HasSubstr("below the minimum 1"));
}

TEST(ParseByteCountTest, AboveMaximumNamesTheMaximum) {
  const absl::Status status = Bytes("1025m", true, 64 << 10, 1 << 30).status();
  ExpectOneLineError(status);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("\"1025m\" is above the maximum 1g"));
}

TEST(ParseByteCountTest, ControlCharactersAreEscapedInTheMessage) {
  const absl::Status status = Bytes("5\nk").status();
  ExpectOneLineError(status);
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"5\\nk\""));
}

TEST(ParseByteCountTest, LongValuesAreCutInTheMessage) {
  const std::string value(1000, 'x');
  const absl::Status status = Bytes(value).status();
  ExpectOneLineError(status);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("\"" + std::string(64, 'x') + "\"... is not"));
}

TEST(ParseDurationNsTest, BareNumberIsMilliseconds) {
  EXPECT_EQ(Duration("200").value(), 200 * kMs);
}

TEST(ParseDurationNsTest, EveryUnit) {
  EXPECT_EQ(Duration("200ms").value(), 200 * kMs);
  EXPECT_EQ(Duration("2s").value(), 2 * kSec);
  EXPECT_EQ(Duration("1500us").value(), 1500 * 1000);
}

TEST(ParseDurationNsTest, BoundsAreInclusive) {
  EXPECT_EQ(Duration("1ms").value(), kMs);
  EXPECT_EQ(Duration("1000us").value(), kMs);
  EXPECT_EQ(Duration("60s").value(), 60 * kSec);
  EXPECT_EQ(Duration("60000").value(), 60 * kSec);
}

TEST(ParseDurationNsTest, OutOfBoundsNamesTheBound) {
  const absl::Status low = Duration("999us").status();
  ExpectOneLineError(low);
  EXPECT_THAT(std::string(low.message()), HasSubstr("below the minimum 1ms"));
  const absl::Status zero = Duration("0").status();
  ExpectOneLineError(zero);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("below the minimum 1ms"));
  const absl::Status high = Duration("61s").status();
  ExpectOneLineError(high);
  EXPECT_EQ(high.message(),
            "TRAFFICRATE_TEST: \"61s\" is above the maximum 60s; use an "
            "integer from 1ms to 60s, in milliseconds or followed by us, ms "
            "or s");
}

TEST(ParseDurationNsTest, OverflowIsAboveTheMaximum) {
  for (const char* value :
       {"9223372036854775807s", "9223372036855ms", "18446744073709551616",
        "99999999999999999999999us"}) {
    const absl::Status status =
        ParseDurationNs(kName, value, 0, std::numeric_limits<int64_t>::max())
            .status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("is above the maximum"))
        << value;
  }
}

TEST(ParseDurationNsTest, MalformedIsRefused) {
  for (const char* value : {"", "ms", "5 ms", "5ms ", " 5", "+5", "-5", "5S",
                            "5MS", "5m", "5h", "1.5s", "5ns", "5sec"}) {
    const absl::Status status = Duration(value).status();
    ExpectOneLineError(status);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(value[0] == '\0' ? "empty" : "is not a duration"))
        << value;
  }
}

TEST(FormatByteCountTest, UsesLargestExactUnit) {
  EXPECT_EQ(FormatByteCount(0, true), "0");
  EXPECT_EQ(FormatByteCount(1536, true), "1536");
  EXPECT_EQ(FormatByteCount(512000, true), "500k");
  EXPECT_EQ(FormatByteCount(uint64_t{3} << 20, true), "3m");
  EXPECT_EQ(FormatByteCount(uint64_t{1} << 30, true), "1g");
  EXPECT_EQ(FormatByteCount(uint64_t{1} << 30, false), "1024m");
}

TEST(FormatByteCountTest, RoundTripsThroughParse) {
  for (const uint64_t bytes : {uint64_t{1}, uint64_t{1023}, uint64_t{1024},
                               uint64_t{5} << 20, uint64_t{7} << 30, kMaxU64}) {
    for (const bool allow_g : {false, true}) {
      EXPECT_EQ(Bytes(FormatByteCount(bytes, allow_g), allow_g).value(), bytes);
    }
  }
}

TEST(FormatDurationNsTest, UsesLargestExactUnit) {
  EXPECT_EQ(FormatDurationNs(0), "0ms");
  EXPECT_EQ(FormatDurationNs(200 * kMs), "200ms");
  EXPECT_EQ(FormatDurationNs(60 * kSec), "60s");
  EXPECT_EQ(FormatDurationNs(1500 * 1000), "1500us");
  EXPECT_EQ(FormatDurationNs(1), "1ns");
}

TEST(QuoteForMessageTest, EscapesAndQuotes) {
  EXPECT_EQ(QuoteForMessage("a\"b\\c\x01"), "\"a\\\"b\\\\c\\x01\"");
  EXPECT_EQ(QuoteForMessage(""), "\"\"");
}

}  // namespace
}  // namespace trafficrate
