// libFuzzer target: every parser of a TRAFFICRATE_* value (config.h,
// units.h, rules.h, key.h), ParseConfig on a whole environment, and a
// whole rules file (rules_file.h). The
// first input byte picks the parser, the rest is the value. Checked: no
// crash or undefined behaviour; an error is InvalidArgument, one non-empty
// line, starting with the variable's name; a value that parses lies in the
// documented range and, where a formatter exists, formats back to text that
// parses to the same value.

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "src/base/units.h"
#include "src/budget/budget.h"
#include "src/config/config.h"
#include "src/config/rules.h"
#include "src/config/rules_file.h"
#include "src/net/key.h"
#include "src/shm/zone.h"
#include "tests/fuzz/fuzz_util.h"

namespace trafficrate {
namespace fuzz {
namespace {

// The names of Variables(), in their order.
std::vector<const char*> VariableNames() {
  std::vector<const char*> names;
  for (const Variable& variable : Variables()) names.push_back(variable.name);
  return names;
}

enum Parser : uint8_t {
  kRate,
  kZoneSize,
  kAfter,
  kIdle,
  kStrict,
  kShare,
  kBurst,
  kLog,
  kZoneName,
  kKey,
  kPorts,
  kExempt,
  kPrefixLength,
  kByteCount,
  kDuration,
  kConfig,
  kConnKey,
  kRulesFile,
  kParserCount,
};

// One line, naming the variable first.
void CheckError(const absl::Status& status, absl::string_view name) {
  TRAFFICRATE_FUZZ_CHECK(!status.ok());
  TRAFFICRATE_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  const absl::string_view message = status.message();
  TRAFFICRATE_FUZZ_CHECK(absl::StartsWith(message, absl::StrCat(name, ": ")));
  TRAFFICRATE_FUZZ_CHECK(message.size() > name.size() + 2);
  TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(message, '\n'));
  TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(message, '\r'));
  TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(message, '\0'));
  // Values are quoted cut to 64 bytes (escaped, at most 4 bytes each), so
  // a huge value cannot flood the log.
  TRAFFICRATE_FUZZ_CHECK(message.size() < 1024);
}

using ByteParser = absl::StatusOr<uint64_t> (*)(absl::string_view);

void CheckByteCount(ByteParser parse, const char* name, bool allow_g,
                    uint64_t min, uint64_t max, absl::string_view value) {
  const absl::StatusOr<uint64_t> bytes = parse(value);
  if (!bytes.ok()) return CheckError(bytes.status(), name);
  TRAFFICRATE_FUZZ_CHECK(*bytes >= min && *bytes <= max);
  const absl::StatusOr<uint64_t> again =
      parse(FormatByteCount(*bytes, allow_g));
  TRAFFICRATE_FUZZ_CHECK(again.ok() && *again == *bytes);
}

void CheckIdle(absl::string_view value) {
  const absl::StatusOr<int64_t> ns = ParseIdleNs(value);
  if (!ns.ok()) return CheckError(ns.status(), kEnvIdle);
  TRAFFICRATE_FUZZ_CHECK(*ns >= kMinIdleNs && *ns <= kMaxIdleNs);
  const absl::StatusOr<int64_t> again = ParseIdleNs(FormatDurationNs(*ns));
  TRAFFICRATE_FUZZ_CHECK(again.ok() && *again == *ns);
}

void CheckKey(absl::string_view value) {
  const absl::StatusOr<KeySpec> spec = ParseKeySpec(value);
  if (!spec.ok()) return CheckError(spec.status(), kEnvKey);
  TRAFFICRATE_FUZZ_CHECK(spec->v4_prefix >= 0 && spec->v4_prefix <= 32);
  TRAFFICRATE_FUZZ_CHECK(spec->v6_prefix >= 0 && spec->v6_prefix <= 128);
  // DescribeKeySpec is what the zone's errors and `stat` show.
  const absl::StatusOr<KeySpec> again = ParseKeySpec(DescribeKeySpec(*spec));
  TRAFFICRATE_FUZZ_CHECK(again.ok() && again->mode == spec->mode);
  if (spec->mode == KeyMode::kPeer) {
    TRAFFICRATE_FUZZ_CHECK(again->v4_prefix == spec->v4_prefix &&
                           again->v6_prefix == spec->v6_prefix);
  }
}

void CheckPorts(absl::string_view value) {
  const absl::StatusOr<std::vector<PortRange>> ports = ParsePorts(value);
  if (!ports.ok()) return CheckError(ports.status(), kEnvPorts);
  TRAFFICRATE_FUZZ_CHECK(!ports->empty());
  for (size_t i = 0; i < ports->size(); ++i) {
    const PortRange& r = (*ports)[i];
    TRAFFICRATE_FUZZ_CHECK(r.first >= 1 && r.first <= r.last);
    // Sorted and merged: neither overlapping nor adjacent.
    if (i > 0) {
      TRAFFICRATE_FUZZ_CHECK(uint32_t{r.first} >
                             uint32_t{(*ports)[i - 1].last} + 1);
    }
  }
  const absl::StatusOr<std::vector<PortRange>> again =
      ParsePorts(FormatPorts(*ports));
  TRAFFICRATE_FUZZ_CHECK(again.ok() && *again == *ports);
  const absl::StatusOr<AcceptRules> rules = AcceptRules::Make(*ports, {});
  TRAFFICRATE_FUZZ_CHECK(rules.ok() && rules->restricts_ports());
  for (const PortRange& r : *ports) {
    TRAFFICRATE_FUZZ_CHECK(rules->GovernsPort(r.first));
    TRAFFICRATE_FUZZ_CHECK(rules->GovernsPort(r.last));
    // Merged: the ports just outside a range are not governed.
    if (r.first > 1) TRAFFICRATE_FUZZ_CHECK(!rules->GovernsPort(r.first - 1));
    if (r.last < 65535) TRAFFICRATE_FUZZ_CHECK(!rules->GovernsPort(r.last + 1));
  }
  TRAFFICRATE_FUZZ_CHECK(!rules->GovernsPort(0));
}

void CheckExempt(absl::string_view value) {
  const absl::StatusOr<std::vector<Cidr>> exempt = ParseExempt(value);
  if (!exempt.ok()) return CheckError(exempt.status(), kEnvExempt);
  TRAFFICRATE_FUZZ_CHECK(!exempt->empty());
  TRAFFICRATE_FUZZ_CHECK(exempt->size() <= size_t{kMaxExemptEntries});
  std::vector<std::string> texts;
  for (const Cidr& c : *exempt) {
    TRAFFICRATE_FUZZ_CHECK(c.family == AF_INET || c.family == AF_INET6);
    TRAFFICRATE_FUZZ_CHECK(c.prefix >= 0 &&
                           c.prefix <= (c.family == AF_INET ? 32 : 128));
    // The network's own address is in it; each item formats back to itself.
    TRAFFICRATE_FUZZ_CHECK(CidrContains(c, c.addr));
    texts.push_back(FormatCidr(c));
    const absl::StatusOr<std::vector<Cidr>> one = ParseExempt(texts.back());
    TRAFFICRATE_FUZZ_CHECK(one.ok() && one->size() == 1 && (*one)[0] == c);
  }
  const absl::StatusOr<std::vector<Cidr>> again =
      ParseExempt(absl::StrJoin(texts, ","));
  TRAFFICRATE_FUZZ_CHECK(again.ok() && *again == *exempt);
  const absl::StatusOr<AcceptRules> rules = AcceptRules::Make({}, *exempt);
  TRAFFICRATE_FUZZ_CHECK(rules.ok());
  TRAFFICRATE_FUZZ_CHECK(rules->exempt_count() ==
                         static_cast<int>(exempt->size()));
  for (const Cidr& c : *exempt) TRAFFICRATE_FUZZ_CHECK(rules->Exempts(c.addr));
}

void CheckLog(absl::string_view value) {
  std::string path = "stale";
  const absl::StatusOr<LogTarget> target = ParseLogTarget(value, &path);
  if (!target.ok()) return CheckError(target.status(), kEnvLog);
  if (*target == LogTarget::kFile) {
    TRAFFICRATE_FUZZ_CHECK(path == value && absl::StartsWith(path, "/"));
  } else {
    TRAFFICRATE_FUZZ_CHECK(path.empty());
  }
}

void CheckZoneName(absl::string_view value) {
  const absl::StatusOr<std::string> name = ParseZoneName(value);
  if (!name.ok()) return CheckError(name.status(), kEnvZone);
  TRAFFICRATE_FUZZ_CHECK(*name == value);
  TRAFFICRATE_FUZZ_CHECK(!name->empty() && name->size() <= 64);
  TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(*name, '/'));
  TRAFFICRATE_FUZZ_CHECK(name->front() != '.');
}

// [0] allow_g, [1..2] digits of min and max as powers of two; the value.
void CheckByteCountAnyRange(absl::string_view value) {
  if (value.size() < 3) return;
  const bool allow_g = value[0] & 1;
  uint64_t a = uint64_t{1} << (static_cast<uint8_t>(value[1]) % 64);
  uint64_t b = uint64_t{1} << (static_cast<uint8_t>(value[2]) % 64);
  if (value[1] & 0x40) a = 0;
  if (a > b) std::swap(a, b);
  const absl::string_view text = value.substr(3);
  const absl::StatusOr<uint64_t> bytes =
      ParseByteCount("TRAFFICRATE_X", text, allow_g, a, b);
  if (!bytes.ok()) return CheckError(bytes.status(), "TRAFFICRATE_X");
  TRAFFICRATE_FUZZ_CHECK(*bytes >= a && *bytes <= b);
  const absl::StatusOr<uint64_t> again = ParseByteCount(
      "TRAFFICRATE_X", FormatByteCount(*bytes, allow_g), allow_g, a, b);
  TRAFFICRATE_FUZZ_CHECK(again.ok() && *again == *bytes);
}

// [0..1] min and max as powers of ten of microseconds; the value.
void CheckDurationAnyRange(absl::string_view value) {
  if (value.size() < 2) return;
  int64_t a = 1000;
  int64_t b = 1000;
  for (int i = 0; i < static_cast<uint8_t>(value[0]) % 16; ++i) a *= 10;
  for (int i = 0; i < static_cast<uint8_t>(value[1]) % 16; ++i) b *= 10;
  if (a > b) std::swap(a, b);
  const absl::StatusOr<int64_t> ns =
      ParseDurationNs("TRAFFICRATE_X", value.substr(2), a, b);
  if (!ns.ok()) return CheckError(ns.status(), "TRAFFICRATE_X");
  TRAFFICRATE_FUZZ_CHECK(*ns >= a && *ns <= b);
}

// The value holds the variables in the order of Variables(), separated by
// '\x01'; an empty field is unset, "\x02" alone is set but empty.
void CheckConfig(absl::string_view value) {
  std::vector<std::string> fields = absl::StrSplit(value, '\x01');
  std::map<std::string, std::string> env;
  int next = 0;
  for (const char* name : VariableNames()) {
    if (next >= static_cast<int>(fields.size())) break;
    std::string& field = fields[next++];
    if (field.empty()) continue;
    // getenv never returns a string with an embedded NUL.
    field = field.substr(0, field.find('\0'));
    env[name] = field == "\x02" ? "" : field;
  }
  int lookups = 0;
  const absl::StatusOr<Config> config =
      ParseConfig([&](const char* name) -> const char* {
        ++lookups;
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      });
  TRAFFICRATE_FUZZ_CHECK(lookups <= static_cast<int>(Variables().size()));
  if (!config.ok()) {
    bool named = false;
    for (const char* name : VariableNames()) {
      if (absl::StartsWith(config.status().message(),
                           absl::StrCat(name, ": "))) {
        CheckError(config.status(), name);
        named = true;
        // The error is the one of the variable it names, which was set,
        // or names a variable that another one needs and was left unset
        // (TRAFFICRATE_CLUSTER_SECRET with TRAFFICRATE_CLUSTER).
        TRAFFICRATE_FUZZ_CHECK(
            env.count(name) == 1 ||
            absl::StartsWith(config.status().message(),
                             absl::StrCat(name, ": unset, but ")));
      }
    }
    TRAFFICRATE_FUZZ_CHECK(named);
    return;
  }
  TRAFFICRATE_FUZZ_CHECK(lookups == static_cast<int>(Variables().size()));
  TRAFFICRATE_FUZZ_CHECK(config->enabled == (env.count(kEnvRate) == 1));
  TRAFFICRATE_FUZZ_CHECK(config->zone_size_bytes >= kMinZoneSize &&
                         config->zone_size_bytes <= kMaxZoneSize);
  const absl::StatusOr<AcceptRules> rules =
      AcceptRules::Make(config->ports, config->exempt);
  TRAFFICRATE_FUZZ_CHECK(rules.ok());
  if (config->log == LogTarget::kFile) {
    TRAFFICRATE_FUZZ_CHECK(absl::StartsWith(config->log_path, "/"));
  }
}

// A key spec from [0], sockaddr bytes from the rest: MakeConnKey, then
// FormatConnKey (what `stat` shows for a key read from the zone).
void CheckConnKey(absl::string_view value) {
  if (value.empty()) return;
  KeySpec spec = KeySpecOf(static_cast<uint8_t>(value[0]));
  if (value[0] & 0x04) {
    // Out-of-range prefixes are clamped.
    spec.v4_prefix = static_cast<int8_t>(value[0]);
    spec.v6_prefix = static_cast<uint8_t>(value[0]) * 3 - 200;
  }
  const absl::string_view bytes = value.substr(1);
  const size_t half = bytes.size() / 2;
  // Unaligned copies, as MakeConnKey documents it accepts.
  std::string peer(bytes.substr(0, half));
  std::string local(bytes.substr(half));
  ConnKey key;
  const bool ok = MakeConnKey(
      spec,
      peer.empty() ? nullptr : reinterpret_cast<const sockaddr*>(peer.data()),
      static_cast<socklen_t>(peer.size()),
      local.empty() ? nullptr : reinterpret_cast<const sockaddr*>(local.data()),
      static_cast<socklen_t>(local.size()), &key);
  if (!ok) TRAFFICRATE_FUZZ_CHECK(key == ConnKey());
  TRAFFICRATE_FUZZ_CHECK(key.bytes[18] == 0 && key.bytes[19] == 0);
  TRAFFICRATE_FUZZ_CHECK(!FormatConnKey(key, spec).empty());
  // Any 20 bytes, as a corrupt zone holds them.
  ConnKey raw;
  std::memcpy(raw.bytes, bytes.data(), std::min(bytes.size(), sizeof(raw)));
  TRAFFICRATE_FUZZ_CHECK(!FormatConnKey(raw, spec).empty());
}

// A whole rules file (rules_file.h): an error is one line at
// "f.rules:LINE:COLUMN: "; a file that parses has 1..kMaxRules rules, each
// with a rate, and every listen entry formats to text that parses back to
// it; matching and the shadow check run on what parsed.
void CheckRulesFile(absl::string_view value) {
  const absl::StatusOr<RulesFile> file = ParseRulesText("f.rules", value);
  if (!file.ok()) {
    const absl::string_view message = file.status().message();
    TRAFFICRATE_FUZZ_CHECK(file.status().code() ==
                           absl::StatusCode::kInvalidArgument);
    TRAFFICRATE_FUZZ_CHECK(absl::StartsWith(message, "f.rules:"));
    TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(message, '\n'));
    TRAFFICRATE_FUZZ_CHECK(!absl::StrContains(message, '\0'));
    TRAFFICRATE_FUZZ_CHECK(message.size() < 2048);
    return;
  }
  TRAFFICRATE_FUZZ_CHECK(!file->rules.empty() &&
                         file->rules.size() <= size_t{kMaxRules});
  for (const Rule& rule : file->rules) {
    TRAFFICRATE_FUZZ_CHECK(rule.unlimited || rule.rate_bytes_per_sec > 0);
    TRAFFICRATE_FUZZ_CHECK(rule.listen.size() <= size_t{kMaxListenEntries});
    for (const ListenEntry& entry : rule.listen) {
      const std::string text = FormatListenEntry(entry);
      const absl::StatusOr<RulesFile> again = ParseRulesText(
          "f.rules", absl::StrCat("[r]\nrate = 1\nlisten = ", text, "\n"));
      TRAFFICRATE_FUZZ_CHECK(again.ok() && again->rules[0].listen.size() == 1 &&
                             again->rules[0].listen[0] == entry);
    }
  }
  uint8_t local[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  uint8_t peer[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
  for (const uint16_t port : {1, 80, 443, 8080, 65535}) {
    const int rule = FirstMatchingRule(file->rules, local, port, peer);
    TRAFFICRATE_FUZZ_CHECK(rule >= -1 &&
                           rule < static_cast<int>(file->rules.size()));
  }
  TRAFFICRATE_FUZZ_CHECK(ShadowedRules(*file).size() < file->rules.size());
  TRAFFICRATE_FUZZ_CHECK(!FormatRules(*file).empty());
}

int FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view value(reinterpret_cast<const char*>(data) + 1,
                                size - 1);
  switch (data[0] % kParserCount) {
    case kRate:
      CheckByteCount(ParseRate, kEnvRate, false, kMinRateBytesPerSec,
                     kMaxRateBytesPerSec, value);
      break;
    case kZoneSize:
      CheckByteCount(ParseZoneSize, kEnvZoneSize, true, kMinZoneSizeBytes,
                     kMaxZoneSizeBytes, value);
      break;
    case kAfter:
      CheckByteCount(ParseAfter, kEnvAfter, true, 0, kMaxAfterBytes, value);
      break;
    case kIdle:
      CheckIdle(value);
      break;
    case kStrict: {
      const absl::StatusOr<bool> strict = ParseStrict(value);
      if (!strict.ok()) {
        CheckError(strict.status(), kEnvStrict);
      } else {
        TRAFFICRATE_FUZZ_CHECK(value == (*strict ? "1" : "0"));
      }
      break;
    }
    case kShare: {
      const absl::StatusOr<ShareMode> share = ParseShare(value);
      if (!share.ok()) {
        CheckError(share.status(), kEnvShare);
      } else {
        TRAFFICRATE_FUZZ_CHECK(ShareModeName(*share) == value);
      }
      break;
    }
    case kBurst:
      CheckByteCount(ParseBurst, kEnvBurst, true, kMinBurstBytes,
                     kMaxBurstBytes, value);
      break;
    case kLog:
      CheckLog(value);
      break;
    case kZoneName:
      CheckZoneName(value);
      break;
    case kKey:
      CheckKey(value);
      break;
    case kPorts:
      CheckPorts(value);
      break;
    case kExempt:
      CheckExempt(value);
      break;
    case kPrefixLength: {
      const int max_bits = value.empty() ? 32 : (value[0] & 1 ? 128 : 32);
      int bits = -1;
      if (ParsePrefixLength(value.substr(value.empty() ? 0 : 1), max_bits,
                            &bits)) {
        TRAFFICRATE_FUZZ_CHECK(bits >= 0 && bits <= max_bits);
      } else {
        TRAFFICRATE_FUZZ_CHECK(bits == -1);
      }
      break;
    }
    case kByteCount:
      CheckByteCountAnyRange(value);
      break;
    case kDuration:
      CheckDurationAnyRange(value);
      break;
    case kConfig:
      CheckConfig(value);
      break;
    case kConnKey:
      CheckConnKey(value);
      break;
    case kRulesFile:
      CheckRulesFile(value);
      break;
    default:
      break;
  }
  return 0;
}

}  // namespace
}  // namespace fuzz
}  // namespace trafficrate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return trafficrate::fuzz::FuzzOne(data, size);
}
