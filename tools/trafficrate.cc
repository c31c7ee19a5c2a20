// trafficrate: run a server under the library, and look at or repair a zone.
//
//   trafficrate run --rate 500k -- nginx -g 'daemon off;'
//   trafficrate stat [--zone NAME] [--json]
//   trafficrate gc [--zone NAME]
//
// Exit codes: 0 ok, 1 the operation failed, 2 usage error.

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "src/config.h"
#include "src/snapshot.h"
#include "src/units.h"
#include "src/zone.h"

namespace trafficrate {
namespace {

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;

constexpr char kUsageText[] =
    R"(usage: trafficrate COMMAND [OPTIONS]

Shares a download rate per client across every process of a TCP server.

commands:
  run [OPTIONS] -- SERVER [ARGS...]
                  run SERVER with the library loaded (LD_PRELOAD) and
                  configured from OPTIONS:
      --rate R        per-client rate, bytes/s; k = x1024, m = x1024^2
                      (TRAFFICRATE_RATE; required)
      --key K         peer | peer/N | peer/N,M | local | all (TRAFFICRATE_KEY)
      --zone NAME     zone name (TRAFFICRATE_ZONE, default "default")
      --zone-size S   zone size, e.g. 32m (TRAFFICRATE_ZONE_SIZE)
      --idle D        idle time before a connection stops taking a share,
                      e.g. 200ms (TRAFFICRATE_IDLE)
      --log L         stderr | syslog | off | /path (TRAFFICRATE_LOG)
      --strict        refuse to start on a bad configuration
      --library P     the libtrafficrate.so to load (default: found next
                      to this program)
  stat [--zone NAME] [--json]
                  keys, active connections, shares and bytes of a zone
  gc [--zone NAME]
                  release the registrations of processes that died
  --version       print the version
  --help          print this text
)";

int Usage(const std::string& error) {
  std::fprintf(stderr, "trafficrate: %s\n(see `trafficrate --help`)\n",
               error.c_str());
  return kUsage;
}

// Parses "--flag VALUE" or "--flag=VALUE" at args[*i].
bool TakeValue(const std::vector<std::string>& args, size_t* i,
               absl::string_view flag, std::string* value) {
  const std::string& arg = args[*i];
  if (arg == flag) {
    if (*i + 1 >= args.size()) return false;
    *value = args[++*i];
    return true;
  }
  if (absl::string_view(arg).substr(0, flag.size()) == flag &&
      arg.size() > flag.size() && arg[flag.size()] == '=') {
    *value = arg.substr(flag.size() + 1);
    return true;
  }
  return false;
}

struct ZoneArgs {
  std::string zone = "default";
  bool json = false;
};

// Parses [--zone NAME] [--json]; returns an error text or "".
std::string ParseZoneArgs(const std::vector<std::string>& args, bool allow_json,
                          ZoneArgs* out) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (TakeValue(args, &i, "--zone", &value)) {
      absl::StatusOr<std::string> zone = ParseZoneName(value);
      if (!zone.ok()) return absl::StrCat("--zone: ", zone.status().message());
      out->zone = *zone;
    } else if (allow_json && args[i] == "--json") {
      out->json = true;
    } else {
      return absl::StrCat("unknown argument \"", args[i], "\"");
    }
  }
  return "";
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void PrintJson(const ZoneSnapshot& s) {
  std::string out = absl::StrFormat(
      "{\"zone\": %s, \"size\": %u, \"rate\": %u, "
      "\"capacity\": {\"keys\": %u, \"connections\": %u, \"processes\": %u}, "
      "\"counters\": {\"table_full\": %u, \"lock_repairs\": %u, "
      "\"processes_reaped\": %u, \"connections_reaped\": %u},\n \"keys\": [",
      JsonString(s.name), s.size_bytes, s.rate_bytes_per_sec, s.key_capacity,
      s.conn_capacity, s.proc_capacity, s.table_full, s.lock_repairs,
      s.procs_reaped, s.conns_reaped);
  const char* sep = "";
  for (const KeySnapshot& k : s.keys) {
    absl::StrAppendFormat(&out,
                          "%s\n  {\"key\": %s, \"active\": %u, "
                          "\"connections\": %u, \"share\": %u, \"bytes\": %u}",
                          sep, JsonString(k.key), k.active, k.connections,
                          k.share_bytes_per_sec, k.bytes_sent);
    sep = ",";
  }
  absl::StrAppend(&out, "],\n \"processes\": [");
  sep = "";
  for (const ProcSnapshot& p : s.processes) {
    absl::StrAppendFormat(
        &out, "%s\n  {\"pid\": %d, \"connections\": %u, \"alive\": %s}", sep,
        p.pid, p.connections, p.alive ? "true" : "false");
    sep = ",";
  }
  absl::StrAppend(&out, "],\n \"connections\": [");
  sep = "";
  for (const ConnSnapshot& c : s.connections) {
    absl::StrAppendFormat(
        &out,
        "%s\n  {\"key\": %s, \"peer\": %s, \"pid\": %d, \"fd\": %d, "
        "\"active\": %s, \"share\": %u, \"bytes\": %u}",
        sep, JsonString(c.key), JsonString(c.peer), c.pid, c.fd,
        c.active ? "true" : "false", c.share_bytes_per_sec, c.bytes_sent);
    sep = ",";
  }
  absl::StrAppend(&out, "]}\n");
  std::fputs(out.c_str(), stdout);
}

void PrintTable(const ZoneSnapshot& s) {
  uint32_t active = 0;
  for (const ConnSnapshot& c : s.connections) active += c.active;
  std::printf(
      "zone %s: rate %s (%llu B/s) per key, %zu keys, %zu connections "
      "(%u sending), %zu processes\n",
      s.name.c_str(), FormatByteCount(s.rate_bytes_per_sec, false).c_str(),
      static_cast<unsigned long long>(s.rate_bytes_per_sec), s.keys.size(),
      s.connections.size(), active, s.processes.size());
  std::printf(
      "capacity %u keys, %u connections, %u processes; table full "
      "%llu times\n\n",
      s.key_capacity, s.conn_capacity, s.proc_capacity,
      static_cast<unsigned long long>(s.table_full));
  std::printf("%-40s %7s %7s %12s %14s\n", "KEY", "ACTIVE", "CONNS",
              "SHARE B/s", "SENT BYTES");
  for (const KeySnapshot& k : s.keys) {
    std::printf("%-40s %7u %7u %12llu %14llu\n", k.key.c_str(), k.active,
                k.connections,
                static_cast<unsigned long long>(k.share_bytes_per_sec),
                static_cast<unsigned long long>(k.bytes_sent));
  }
}

int Failed(const absl::Status& status) {
  std::fprintf(stderr, "trafficrate: %s\n", status.ToString().c_str());
  return kFailed;
}

// Parses [--zone NAME] (and --json where allowed) for `command` and attaches
// to the zone. Returns kOk with *zone set, or the exit code to return.
int OpenZone(absl::string_view command, const std::vector<std::string>& args,
             bool allow_json, ZoneArgs* za, std::unique_ptr<Zone>* zone) {
  const std::string error = ParseZoneArgs(args, allow_json, za);
  if (!error.empty()) return Usage(absl::StrCat(command, ": ", error));
  absl::StatusOr<std::unique_ptr<Zone>> attached = Zone::Attach(za->zone);
  if (!attached.ok()) return Failed(attached.status());
  *zone = std::move(*attached);
  return kOk;
}

int Stat(const std::vector<std::string>& args) {
  ZoneArgs za;
  std::unique_ptr<Zone> zone;
  if (int rc = OpenZone("stat", args, /*allow_json=*/true, &za, &zone)) {
    return rc;
  }
  absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(*zone);
  if (!snap.ok()) return Failed(snap.status());
  za.json ? PrintJson(*snap) : PrintTable(*snap);
  return kOk;
}

int Gc(const std::vector<std::string>& args) {
  ZoneArgs za;
  std::unique_ptr<Zone> zone;
  if (int rc = OpenZone("gc", args, /*allow_json=*/false, &za, &zone)) {
    return rc;
  }
  uint32_t procs = 0;
  const uint32_t conns = zone->ReapDead(&procs);
  std::printf("zone %s: released %u connection(s) of %u dead process(es)\n",
              za.zone.c_str(), conns, procs);
  return kOk;
}

// The library beside this program: <prefix>/bin/trafficrate ->
// <prefix>/lib/libtrafficrate.so, or the build tree's own directory.
std::string FindLibrary() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  std::string dir(exe);
  dir.resize(dir.rfind('/'));
  for (const std::string& candidate :
       {absl::StrCat(dir, "/../lib/libtrafficrate.so"),
        absl::StrCat(dir, "/libtrafficrate.so")}) {
    char resolved[PATH_MAX];
    if (realpath(candidate.c_str(), resolved) != nullptr) return resolved;
  }
  return "";
}

int Run(const std::vector<std::string>& args) {
  struct Flag {
    const char* flag;
    const char* env;
  };
  static constexpr Flag kFlags[] = {
      {"--rate", kEnvRate},          {"--key", kEnvKey},   {"--zone", kEnvZone},
      {"--zone-size", kEnvZoneSize}, {"--idle", kEnvIdle}, {"--log", kEnvLog},
  };
  std::string library;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    std::string value;
    bool known = false;
    for (const Flag& f : kFlags) {
      if (TakeValue(args, &i, f.flag, &value)) {
        setenv(f.env, value.c_str(), 1);
        known = true;
        break;
      }
    }
    if (known) continue;
    if (args[i] == "--strict") {
      setenv(kEnvStrict, "1", 1);
    } else if (TakeValue(args, &i, "--library", &value)) {
      library = value;
    } else {
      return Usage(absl::StrCat("run: unknown option \"", args[i], "\""));
    }
  }
  if (i + 1 >= args.size()) {
    return Usage(
        "run: give the server after --, e.g. trafficrate run "
        "--rate 500k -- nginx");
  }
  if (getenv(kEnvRate) == nullptr) {
    return Usage("run: --rate is required (e.g. --rate 500k)");
  }
  absl::StatusOr<Config> config =
      ParseConfig([](const char* name) -> const char* { return getenv(name); });
  if (!config.ok()) {
    return Usage(absl::StrCat("run: ", config.status().message()));
  }
  if (library.empty()) library = FindLibrary();
  if (library.empty() || access(library.c_str(), R_OK) != 0) {
    std::fprintf(stderr,
                 "trafficrate: run: cannot find libtrafficrate.so (looked "
                 "beside this program); give it with --library PATH\n");
    return kFailed;
  }
  const char* preload = getenv("LD_PRELOAD");
  const std::string value = preload != nullptr && *preload != '\0'
                                ? absl::StrCat(library, ":", preload)
                                : library;
  setenv("LD_PRELOAD", value.c_str(), 1);
  std::vector<char*> argv;
  for (size_t j = i + 1; j < args.size(); ++j) {
    argv.push_back(const_cast<char*>(args[j].c_str()));
  }
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "trafficrate: run: cannot execute %s: %s\n", argv[0],
               strerror(errno));
  return kFailed;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsageText, stderr);
    return kUsage;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "--version" || command == "version") {
    std::printf("trafficrate %s\n", TRAFFICRATE_VERSION);
    return kOk;
  }
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsageText, stdout);
    return kOk;
  }
  if (command == "stat") return Stat(args);
  if (command == "gc") return Gc(args);
  if (command == "run") return Run(args);
  return Usage(absl::StrCat("unknown command \"", command, "\""));
}

}  // namespace
}  // namespace trafficrate

int main(int argc, char** argv) { return trafficrate::Main(argc, argv); }
