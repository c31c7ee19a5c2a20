#include "src/config/cluster_url.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace trafficrate {
namespace {

constexpr char kUrlForm[] =
    "use redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], e.g. "
    "redis://10.0.0.5:6379/2";
constexpr size_t kMaxHostBytes = 253;  // a DNS name
constexpr int kMaxDb = 1 << 20;

// The URL is not echoed: it may hold a password.
absl::Status UrlError(absl::string_view variable, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(variable, ": ", what, "; ", kUrlForm));
}

bool IsHostNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' ||
         c == '.' || c == '_';
}

// Decimal in [low, high], digits only.
bool ParseBoundedInt(absl::string_view text, int low, int high, int* out) {
  if (text.empty() || text.size() > 9) return false;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < low || value > high) {
    return false;
  }
  *out = value;
  return true;
}

}  // namespace

absl::StatusOr<ClusterUrl> ParseClusterUrl(absl::string_view url,
                                           absl::string_view variable) {
  if (url.empty()) return UrlError(variable, "empty");
  if (absl::StartsWith(url, "rediss://")) {
    return UrlError(variable,
                    "TLS (rediss://) is not supported: Debian 12's hiredis "
                    "0.14 has no TLS; reach Redis over a trusted network or "
                    "a tunnel");
  }
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "redis://")) {
    return UrlError(variable, "is not a redis:// URL");
  }
  ClusterUrl parsed;
  // Credentials: everything before the last '@' (a password may hold '@').
  if (const size_t at = rest.rfind('@'); at != absl::string_view::npos) {
    const absl::string_view credentials = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    const size_t colon = credentials.find(':');
    if (colon == absl::string_view::npos) {
      return UrlError(variable,
                      "the part before @ must be :PASSWORD or USER:PASSWORD");
    }
    parsed.user = std::string(credentials.substr(0, colon));
    parsed.password = std::string(credentials.substr(colon + 1));
    if (parsed.password.empty()) {
      return UrlError(variable, "the password after : is empty");
    }
  }
  absl::string_view authority = rest;
  absl::string_view path;
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    authority = rest.substr(0, slash);
    path = rest.substr(slash + 1);
  }
  absl::string_view host = authority;
  absl::string_view port;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) {
      return UrlError(variable, "an IPv6 address needs its closing ]");
    }
    port = host.substr(close + 1);
    host = host.substr(0, close);
    if (!port.empty() && !absl::ConsumePrefix(&port, ":")) {
      return UrlError(variable, "expected :PORT after ]");
    }
    bool ok = !host.empty();
    for (const char c : host) {
      ok = ok && (absl::ascii_isxdigit(static_cast<unsigned char>(c)) ||
                  c == ':' || c == '.');
    }
    if (!ok) return UrlError(variable, "bad IPv6 address in [ ]");
  } else {
    if (const size_t colon = host.find(':'); colon != absl::string_view::npos) {
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
      if (port.empty()) return UrlError(variable, "the port is empty");
    }
    bool ok = !host.empty() && host.size() <= kMaxHostBytes;
    for (const char c : host) ok = ok && IsHostNameChar(c);
    if (!ok) return UrlError(variable, "the host is missing or invalid");
  }
  parsed.host = std::string(host);
  if (!port.empty() && !ParseBoundedInt(port, 1, 65535, &parsed.port)) {
    return UrlError(variable, "the port must be 1 to 65535");
  }
  if (!path.empty() && !ParseBoundedInt(path, 0, kMaxDb, &parsed.db)) {
    return UrlError(variable,
                    absl::StrCat("the database after / must be 0 to ", kMaxDb));
  }
  return parsed;
}

std::string DescribeClusterUrl(const ClusterUrl& url) {
  const bool v6 = url.host.find(':') != std::string::npos;
  return absl::StrCat(
      "redis://", url.password.empty() ? "" : absl::StrCat(url.user, ":***@"),
      v6 ? "[" : "", url.host, v6 ? "]" : "", ":", url.port, "/", url.db);
}

std::string ClusterHostId(absl::string_view host, absl::string_view zone_name) {
  if (!host.empty()) return absl::StrCat(host, "/", zone_name);
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return absl::StrCat("localhost/", zone_name);
  }
  return absl::StrCat(name, "/", zone_name);
}

}  // namespace trafficrate
