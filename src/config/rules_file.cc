#include "src/config/rules_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "src/base/status_macros.h"
#include "src/base/units.h"
#include "src/config/rules.h"
#include "src/net/key.h"

namespace trafficrate {
namespace {

constexpr size_t kMaxLineBytes = 4096;
constexpr uint64_t kMaxRuleRate = uint64_t{1} << 40;   // as TRAFFICRATE_RATE
constexpr uint64_t kMaxRuleAfter = uint64_t{1} << 40;  // as TRAFFICRATE_AFTER
constexpr uint64_t kMinRuleBurst = uint64_t{1} << 10;  // as TRAFFICRATE_BURST
constexpr uint64_t kMaxRuleBurst = uint64_t{1} << 30;

constexpr char kFields[] = "listen, clients, exempt, key, rate, after or burst";
constexpr char kListenForm[] =
    "use a comma-separated list of PORT, PORT-PORT, ADDRESS:PORT[-PORT], "
    "[IPV6]:PORT[-PORT], *:PORT or ADDRESS (every port), e.g. 80, "
    "127.0.0.1:8000-8099, [::1]:8080";
constexpr char kCidrForm[] =
    "use a comma-separated list of IP addresses or networks, e.g. "
    "10.0.0.0/8, 127.0.0.3, 2001:db8::/32, ::1";
constexpr char kNameForm[] =
    "a section header is [NAME], NAME 1 to 31 of A-Z a-z 0-9 _ . -";

// Where a problem is: 1-based line and column of the file.
struct Where {
  absl::string_view path;
  int line = 0;
  int column = 0;
};

absl::Status ErrorAt(const Where& at, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(at.path, ":", at.line, ":", at.column, ": ", problem));
}

// The message of a variable's parser with its "TRAFFICRATE_X: " replaced by
// the field's name.
std::string AsField(absl::string_view field, const absl::Status& status) {
  absl::string_view message = status.message();
  if (absl::StartsWith(message, "TRAFFICRATE_")) {
    const size_t colon = message.find(": ");
    if (colon != absl::string_view::npos) message.remove_prefix(colon + 2);
  }
  return absl::StrCat(field, ": ", message);
}

// A path as messages show it: as is when it is plain printable ASCII, else
// quoted and escaped (a newline in it cannot split the one-line message).
std::string PathForMessage(absl::string_view path) {
  bool plain = !path.empty() && path.size() <= 256;
  for (const char c : path) {
    plain = plain && absl::ascii_isprint(static_cast<uint8_t>(c));
  }
  return plain ? std::string(path) : QuoteForMessage(path);
}

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<uint8_t>(c)) || c == '_' || c == '.' ||
         c == '-';
}

// One comma-separated item of a value and its column.
struct Item {
  absl::string_view text;
  int column = 0;
};

// Splits `value` (starting at `column`) at commas, blanks stripped. Returns
// the column of an empty item, or 0.
int SplitItems(absl::string_view value, int column, std::vector<Item>* items) {
  size_t start = 0;
  for (;;) {
    const size_t comma = value.find(',', start);
    absl::string_view raw = value.substr(start, comma == absl::string_view::npos
                                                    ? absl::string_view::npos
                                                    : comma - start);
    const size_t lead =
        raw.size() - absl::StripLeadingAsciiWhitespace(raw).size();
    absl::string_view text = absl::StripAsciiWhitespace(raw);
    const int at = column + static_cast<int>(start + lead);
    if (text.empty()) return at;
    items->push_back(Item{text, at});
    if (comma == absl::string_view::npos) return 0;
    start = comma + 1;
  }
}

// One `listen` item; on error, returns the problem.
std::string ParseListenItem(absl::string_view item, ListenEntry* entry) {
  *entry = ListenEntry{};
  entry->ports = PortRange{1, 65535};
  absl::string_view address;
  absl::string_view ports;
  bool has_address = false;
  if (absl::ConsumePrefix(&item, "[")) {
    const size_t close = item.find(']');
    if (close == absl::string_view::npos) {
      return absl::StrCat(QuoteForMessage(item), " has no closing ]");
    }
    address = item.substr(0, close);
    absl::string_view rest = item.substr(close + 1);
    if (!rest.empty() && !absl::ConsumePrefix(&rest, ":")) {
      return absl::StrCat(QuoteForMessage(rest), " after ] is not :PORT");
    }
    has_address = true;
    ports = rest.empty() ? "*" : rest;
    if (address.find(':') == absl::string_view::npos) {
      return absl::StrCat(QuoteForMessage(address),
                          " in [ ] is not an IPv6 address");
    }
  } else if (item.find(':') != absl::string_view::npos) {
    const size_t colon = item.rfind(':');
    address = item.substr(0, colon);
    ports = item.substr(colon + 1);
    if (address.find(':') != absl::string_view::npos) {
      return absl::StrCat(QuoteForMessage(item),
                          ": write an IPv6 address in brackets, [::1]:80");
    }
    has_address = address != "*";
  } else if (item.find('.') != absl::string_view::npos) {
    address = item;
    ports = "*";
    has_address = true;
  } else {
    ports = item;
  }
  if (has_address) {
    if (address.find('/') != absl::string_view::npos) {
      return absl::StrCat(QuoteForMessage(address),
                          " is a network: a local address is one address");
    }
    std::string problem = ParseCidrItem(address, &entry->address);
    if (!problem.empty()) return problem;
    // 0.0.0.0 and :: (however written) are every local address, as in a
    // server's own listen directive; the rest is one address.
    static constexpr uint8_t kAny[16] = {};
    entry->any_address =
        entry->address.family == AF_INET
            ? std::memcmp(entry->address.addr + 12, kAny, 4) == 0
            : std::memcmp(entry->address.addr, kAny, 16) == 0;
    if (entry->any_address) entry->address = Cidr{};
  }
  if (ports == "*") return "";
  if (ports.empty()) return absl::StrCat(QuoteForMessage(item), " has no port");
  return ParsePortItem(ports, &entry->ports);
}

// A field's value; on error, the status to return.
absl::Status ParseField(absl::string_view field, absl::string_view value,
                        const Where& at, Rule* rule) {
  auto list_error = [&](int column, absl::string_view problem,
                        absl::string_view form) {
    return ErrorAt(Where{at.path, at.line, column},
                   absl::StrCat(field, ": ", problem, "; ", form));
  };
  if (field == "listen" || field == "clients" || field == "exempt") {
    std::vector<Item> items;
    const bool listen = field == "listen";
    const absl::string_view form = listen ? kListenForm : kCidrForm;
    if (const int empty = SplitItems(value, at.column, &items); empty != 0) {
      return list_error(empty, "empty item", form);
    }
    const size_t max = listen ? kMaxListenEntries : kMaxClientEntries;
    if (items.size() > max) {
      return list_error(items[max].column,
                        absl::StrCat("more than ", max, " items"), form);
    }
    for (const Item& item : items) {
      std::string problem;
      if (listen) {
        ListenEntry entry;
        problem = ParseListenItem(item.text, &entry);
        if (problem.empty()) rule->listen.push_back(entry);
      } else {
        Cidr cidr;
        problem = ParseCidrItem(item.text, &cidr);
        if (problem.empty()) {
          (field == "clients" ? rule->clients : rule->exempt).push_back(cidr);
        }
      }
      if (!problem.empty()) return list_error(item.column, problem, form);
    }
    return absl::OkStatus();
  }
  if (field == "key") {
    absl::StatusOr<KeySpec> key = ParseKeySpec(value);
    if (!key.ok()) return ErrorAt(at, AsField(field, key.status()));
    rule->key = *key;
    return absl::OkStatus();
  }
  if (field == "rate") {
    if (value == "unlimited") {
      rule->unlimited = true;
      return absl::OkStatus();
    }
    absl::StatusOr<uint64_t> rate =
        ParseByteCount("rate", value, /*allow_g=*/false, 1, kMaxRuleRate);
    if (!rate.ok()) {
      return ErrorAt(at,
                     absl::StrCat(rate.status().message(), ", or unlimited"));
    }
    rule->rate_bytes_per_sec = *rate;
    return absl::OkStatus();
  }
  const bool after = field == "after";
  absl::StatusOr<uint64_t> bytes =
      ParseByteCount(field, value, /*allow_g=*/true, after ? 0 : kMinRuleBurst,
                     after ? kMaxRuleAfter : kMaxRuleBurst);
  if (!bytes.ok()) return ErrorAt(at, bytes.status().message());
  (after ? rule->after_bytes : rule->burst_bytes) = *bytes;
  return absl::OkStatus();
}

// Strips a trailing comment: '#' at the start or after a blank.
absl::string_view WithoutComment(absl::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '#' &&
        (i == 0 || absl::ascii_isblank(static_cast<uint8_t>(line[i - 1])))) {
      return line.substr(0, i);
    }
  }
  return line;
}

int ColumnOf(absl::string_view line, absl::string_view part) {
  return static_cast<int>(part.data() - line.data()) + 1;
}

// A "[NAME]" line; `at` is the line's start.
absl::Status ParseHeader(absl::string_view line, absl::string_view text,
                         Where at, RulesFile* file) {
  at.column = ColumnOf(line, text);
  if (!absl::EndsWith(text, "]")) {
    return ErrorAt(at, absl::StrCat(QuoteForMessage(text),
                                    " is not a section header; ", kNameForm));
  }
  absl::string_view name = text.substr(1, text.size() - 2);
  bool ok = !name.empty() && name.size() <= kMaxRuleNameBytes;
  for (const char c : name) ok = ok && IsNameChar(c);
  if (!ok) {
    return ErrorAt(at, absl::StrCat(QuoteForMessage(name),
                                    " is not a rule name; ", kNameForm));
  }
  for (const Rule& rule : file->rules) {
    if (rule.name == name) {
      return ErrorAt(at,
                     absl::StrCat("rule \"", name, "\" again (line ", rule.line,
                                  "); each rule has its own "
                                  "name"));
    }
  }
  if (file->rules.size() >= static_cast<size_t>(kMaxRules)) {
    return ErrorAt(at,
                   absl::StrCat("more than ", kMaxRules, " rules; merge some"));
  }
  Rule rule;
  rule.name = std::string(name);
  rule.line = at.line;
  file->rules.push_back(std::move(rule));
  return absl::OkStatus();
}

// A rule is complete: it has a rate.
absl::Status CheckComplete(const RulesFile& file, int seen_rate,
                           absl::string_view path) {
  if (file.rules.empty() || seen_rate != 0) return absl::OkStatus();
  const Rule& rule = file.rules.back();
  return ErrorAt(Where{path, rule.line, 1},
                 absl::StrCat("rule \"", rule.name,
                              "\" has no rate; add rate = RATE (500k, 2m) or "
                              "rate = unlimited"));
}

// Whether `outer` contains every address of `inner`.
bool CidrCovers(const Cidr& outer, const Cidr& inner) {
  if (!CidrContains(outer, inner.addr)) return false;
  const int outer_bits =
      outer.family == AF_INET ? outer.prefix + 96 : outer.prefix;
  const int inner_bits =
      inner.family == AF_INET ? inner.prefix + 96 : inner.prefix;
  return outer_bits <= inner_bits;
}

bool ListCovers(const std::vector<Cidr>& outer,
                const std::vector<Cidr>& inner) {
  if (outer.empty()) return true;
  if (inner.empty()) return false;
  for (const Cidr& in : inner) {
    bool covered = false;
    for (const Cidr& out : outer) covered = covered || CidrCovers(out, in);
    if (!covered) return false;
  }
  return true;
}

bool ListenCovers(const ListenEntry& outer, const ListenEntry& inner) {
  if (outer.ports.first > inner.ports.first ||
      outer.ports.last < inner.ports.last) {
    return false;
  }
  if (outer.any_address) return true;
  return !inner.any_address && outer.address == inner.address;
}

bool ListenListCovers(const std::vector<ListenEntry>& outer,
                      const std::vector<ListenEntry>& inner) {
  if (outer.empty()) return true;
  if (inner.empty()) return false;
  for (const ListenEntry& in : inner) {
    bool covered = false;
    for (const ListenEntry& out : outer) {
      covered = covered || ListenCovers(out, in);
    }
    if (!covered) return false;
  }
  return true;
}

std::string CidrList(const std::vector<Cidr>& list, absl::string_view none) {
  if (list.empty()) return std::string(none);
  return absl::StrJoin(list, ", ", [](std::string* out, const Cidr& c) {
    out->append(FormatCidr(c));
  });
}

}  // namespace

bool operator==(const ListenEntry& a, const ListenEntry& b) {
  return a.any_address == b.any_address && a.ports == b.ports &&
         (a.any_address || a.address == b.address);
}

absl::StatusOr<RulesFile> ParseRulesText(absl::string_view raw_path,
                                         absl::string_view text) {
  RulesFile file;
  file.path = std::string(raw_path);
  const std::string shown = PathForMessage(raw_path);
  const absl::string_view path = shown;
  if (text.size() > kMaxRulesFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than 1 MiB; a rules file holds at most ",
                     kMaxRules, " rules"));
  }
  std::vector<std::string> seen;  // fields of the current rule
  int seen_rate = 0;
  int line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    absl::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    Where at{path, line_no, 1};
    if (line.size() > kMaxLineBytes) {
      return ErrorAt(at, "line longer than 4096 bytes");
    }
    if (const size_t nul = line.find('\0'); nul != absl::string_view::npos) {
      at.column = static_cast<int>(nul) + 1;
      return ErrorAt(at, "a NUL byte; a rules file is text");
    }
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    absl::string_view body = absl::StripAsciiWhitespace(WithoutComment(line));
    if (body.empty() || body.front() == ';') continue;
    if (body.front() == '[') {
      TRAFFICRATE_RETURN_IF_ERROR(CheckComplete(file, seen_rate, path));
      TRAFFICRATE_RETURN_IF_ERROR(ParseHeader(line, body, at, &file));
      seen.clear();
      seen_rate = 0;
      continue;
    }
    const size_t eq = body.find('=');
    at.column = ColumnOf(line, body);
    if (eq == absl::string_view::npos) {
      return ErrorAt(at, absl::StrCat(QuoteForMessage(body),
                                      " is not FIELD = VALUE or [NAME]"));
    }
    const absl::string_view field =
        absl::StripAsciiWhitespace(body.substr(0, eq));
    const absl::string_view value =
        absl::StripAsciiWhitespace(body.substr(eq + 1));
    if (file.rules.empty()) {
      return ErrorAt(at,
                     "a field before the first rule; start each rule "
                     "with a section header [NAME]");
    }
    const bool known = field == "listen" || field == "clients" ||
                       field == "exempt" || field == "key" || field == "rate" ||
                       field == "after" || field == "burst";
    if (!known) {
      return ErrorAt(at, absl::StrCat("unknown field ", QuoteForMessage(field),
                                      "; a rule has ", kFields));
    }
    for (const std::string& s : seen) {
      if (s == field) {
        return ErrorAt(
            at, absl::StrCat(field, " again in rule \"", file.rules.back().name,
                             "\"; give each field once"));
      }
    }
    seen.emplace_back(field);
    Where value_at = at;
    value_at.column = value.empty() ? static_cast<int>(line.size()) + 1
                                    : ColumnOf(line, value);
    if (value.empty()) {
      return ErrorAt(value_at, absl::StrCat(field, ": empty value"));
    }
    TRAFFICRATE_RETURN_IF_ERROR(
        ParseField(field, value, value_at, &file.rules.back()));
    if (field == "rate") seen_rate = 1;
  }
  TRAFFICRATE_RETURN_IF_ERROR(CheckComplete(file, seen_rate, path));
  if (file.rules.empty()) {
    return ErrorAt(Where{path, line_no > 0 ? line_no : 1, 1},
                   "no rules; a rules file holds sections [NAME] with at "
                   "least rate = RATE");
  }
  return file;
}

absl::StatusOr<RulesFile> ReadRulesFile(const std::string& path) {
  const std::string shown = PathForMessage(path);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", shown));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("fstat ", shown));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": not a regular file; give a rules file"));
  }
  std::string text;
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("read ", shown));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxRulesFileBytes) break;
  }
  close(fd);
  return ParseRulesText(path, text);
}

bool RuleMatches(const Rule& rule, const uint8_t local16[16],
                 uint16_t local_port, const uint8_t peer16[16]) {
  bool listen = rule.listen.empty();
  for (const ListenEntry& e : rule.listen) {
    if (local_port < e.ports.first || local_port > e.ports.last) continue;
    if (e.any_address ||
        std::memcmp(e.address.addr, local16, sizeof(e.address.addr)) == 0) {
      listen = true;
      break;
    }
  }
  if (!listen) return false;
  if (rule.clients.empty()) return true;
  for (const Cidr& c : rule.clients) {
    if (CidrContains(c, peer16)) return true;
  }
  return false;
}

int FirstMatchingRule(const std::vector<Rule>& rules, const uint8_t local16[16],
                      uint16_t local_port, const uint8_t peer16[16]) {
  for (size_t i = 0; i < rules.size(); ++i) {
    if (RuleMatches(rules[i], local16, local_port, peer16)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::vector<std::string> ShadowedRules(const RulesFile& file) {
  std::vector<std::string> lines;
  for (size_t b = 1; b < file.rules.size(); ++b) {
    const Rule& later = file.rules[b];
    for (size_t a = 0; a < b; ++a) {
      const Rule& earlier = file.rules[a];
      if (ListenListCovers(earlier.listen, later.listen) &&
          ListCovers(earlier.clients, later.clients)) {
        lines.push_back(
            absl::StrCat("rule \"", later.name, "\" (line ", later.line,
                         ") can never match: rule \"", earlier.name,
                         "\" (line ", earlier.line,
                         ") comes first and matches every connection it "
                         "would"));
        break;
      }
    }
  }
  return lines;
}

std::string FormatListenEntry(const ListenEntry& e) {
  const bool all_ports = e.ports.first == 1 && e.ports.last == 65535;
  std::string ports = e.ports.first == e.ports.last
                          ? absl::StrCat(e.ports.first)
                          : absl::StrCat(e.ports.first, "-", e.ports.last);
  if (e.any_address) return all_ports ? "*:*" : ports;
  std::string address = FormatCidr(e.address);
  if (e.address.family == AF_INET6) address = absl::StrCat("[", address, "]");
  return all_ports ? address : absl::StrCat(address, ":", ports);
}

std::string FormatRules(const RulesFile& file) {
  std::string out;
  for (size_t i = 0; i < file.rules.size(); ++i) {
    const Rule& r = file.rules[i];
    std::string listen =
        r.listen.empty()
            ? "every local address and port"
            : absl::StrJoin(r.listen, ", ",
                            [](std::string* o, const ListenEntry& e) {
                              o->append(FormatListenEntry(e));
                            });
    absl::StrAppend(
        &out, i + 1, ". [", r.name, "] (line ", r.line, ")\n", "  listen   ",
        listen, "\n", "  clients  ", CidrList(r.clients, "every client"), "\n",
        "  exempt   ", CidrList(r.exempt, "none"), "\n", "  key      ",
        DescribeKeySpec(r.key), "\n", "  rate     ",
        r.unlimited ? std::string("unlimited (matches, never paces)")
                    : absl::StrCat(FormatByteCount(r.rate_bytes_per_sec,
                                                   /*allow_g=*/false),
                                   " (", r.rate_bytes_per_sec, " bytes/s)"),
        "\n", "  after    ", FormatByteCount(r.after_bytes, /*allow_g=*/true),
        "\n", "  burst    ",
        r.burst_bytes == 0
            ? std::string("default (50 ms of the rate, at least 16k)")
            : FormatByteCount(r.burst_bytes, /*allow_g=*/true),
        "\n");
  }
  return out;
}

}  // namespace trafficrate
