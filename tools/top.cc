// trafficrate top: a live, self-refreshing view of a zone's busiest clients,
// with each one's rate against the limit as a bar. Quits on q or Ctrl-C and
// restores the terminal.

#include "tools/top.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/base/clock.h"
#include "src/shm/snapshot.h"
#include "src/shm/zone.h"
#include "tools/cli.h"
#include "tools/format.h"

namespace trafficrate {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// Raw, silent keyboard and the alternate screen for the life of the object.
class Terminal {
 public:
  Terminal() {
    if (tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      have_saved_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::fputs("\033[?1049h\033[?25l", stdout);
    std::fflush(stdout);
  }
  ~Terminal() {
    std::fputs("\033[?25h\033[?1049l", stdout);
    std::fflush(stdout);
    if (have_saved_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

 private:
  termios saved_{};
  bool have_saved_ = false;
};

int Columns() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) {
    return ws.ws_col;
  }
  return 80;
}

int Rows() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row >= 8) {
    return ws.ws_row;
  }
  return 24;
}

// Waits up to timeout_ms for a key; true if it was q or Q.
bool QuitPressed(int timeout_ms) {
  pollfd pfd{STDIN_FILENO, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0 || !(pfd.revents & POLLIN)) return false;
  char buf[16];
  const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
  for (ssize_t i = 0; i < n; ++i) {
    if (buf[i] == 'q' || buf[i] == 'Q' || buf[i] == 3) return true;
  }
  return false;
}

}  // namespace

std::vector<TopRow> TopRows(const ZoneSnapshot& now, const ZoneSnapshot* before,
                            size_t limit) {
  std::map<std::string, uint64_t> previous;
  if (before != nullptr) {
    for (const KeySnapshot& k : before->keys) previous[k.key] = k.bytes_sent;
  }
  const double seconds =
      before != nullptr && now.taken_ns > before->taken_ns
          ? static_cast<double>(now.taken_ns - before->taken_ns) / kNsPerSec
          : 0;
  std::vector<TopRow> rows;
  for (const KeySnapshot& k : now.keys) {
    TopRow row{k, 0};
    const auto it = previous.find(k.key);
    if (seconds > 0 && it != previous.end() && k.bytes_sent >= it->second) {
      const double rate = (k.bytes_sent - it->second) / seconds;
      row.bytes_per_sec =
          rate >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(rate);
    }
    rows.push_back(row);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const TopRow& a, const TopRow& b) {
                     if (a.bytes_per_sec != b.bytes_per_sec) {
                       return a.bytes_per_sec > b.bytes_per_sec;
                     }
                     if (a.key.active != b.key.active)
                       return a.key.active > b.key.active;
                     return a.key.key < b.key.key;
                   });
  if (rows.size() > limit) rows.resize(limit);
  return rows;
}

std::string TopBar(uint64_t bytes_per_sec, uint64_t limit, int width) {
  const double fill =
      limit > 0 ? static_cast<double>(bytes_per_sec) / limit : 0;
  // Clamped as a double: a corrupt zone's rate may be any multiple of it.
  const int full = static_cast<int>(
      std::clamp(fill * width + 0.5, 0.0, static_cast<double>(width)));
  return absl::StrCat("[", std::string(full, '#'),
                      std::string(width - full, '.'), "]");
}

std::string FormatTopFrame(const ZoneSnapshot& now, const ZoneSnapshot* before,
                           int columns, int rows) {
  std::string out = absl::StrFormat(
      "trafficrate top - zone %s - %s per client - %zu clients, %zu "
      "connections (%zu sending), %zu processes\n\n",
      now.name, HumanRate(now.rate_bytes_per_sec), now.keys.size(),
      now.connections.size(), ActiveConnections(now), LiveProcesses(now));
  // With a cluster: its state, and per key its sending connections on every
  // host (FLEET) and the hosts it is on; SHARE/CONN is then of this host's
  // share of the rate.
  const bool fleet = now.has_cluster;
  if (fleet) {
    // Cut to the terminal's width: a wrapped line would push the last row
    // off the screen.
    std::string line = ClusterLine(now.cluster);
    line.pop_back();
    out += line.substr(0, static_cast<size_t>(columns)) + "\n\n";
  }
  // RATE: what the server handed to the kernel over the interval; MEASURED
  // (budget mode): what left the sockets, as the controller counts it.
  const bool budget = now.share_mode == ShareMode::kBudget;
  const int bar = std::clamp(columns - (fleet ? 107 : 94), 10, 40);
  absl::StrAppendFormat(
      &out, "%-39s %11s %-*s %11s %6s %6s%s %11s\n", "CLIENT", "RATE", bar + 2,
      "OF LIMIT", "MEASURED", "ACTIVE", "CONNS",
      fleet ? absl::StrFormat(" %6s %5s", "FLEET", "HOSTS") : "", "SHARE/CONN");
  const size_t limit =
      rows > (fleet ? 8 : 6) ? static_cast<size_t>(rows - (fleet ? 8 : 6)) : 1;
  for (const TopRow& r : TopRows(now, before, limit)) {
    absl::StrAppendFormat(
        &out, "%-39s %11s %s %11s %6u %6u%s %11s\n", r.key.key,
        HumanRate(r.bytes_per_sec),
        TopBar(r.bytes_per_sec,
               r.key.rate_bytes_per_sec > 0 ? r.key.rate_bytes_per_sec
                                            : now.rate_bytes_per_sec,
               bar),
        budget ? HumanRate(r.key.measured_bytes_per_sec) : "-", r.key.active,
        r.key.connections,
        fleet ? absl::StrFormat(" %6u %5u", r.key.cluster_active,
                                r.key.cluster_hosts)
              : "",
        HumanRate(r.key.share_bytes_per_sec));
  }
  if (now.keys.empty()) absl::StrAppend(&out, "no clients\n");
  absl::StrAppend(&out, "\nq: quit\n");
  return out;
}

int TopCommand(const std::vector<std::string>& raw) {
  ParsedArgs args;
  std::string name;
  int rc = kExitOk;
  if (!Parse("top", raw, false, &args, &rc) ||
      !NoPositionals("top", args, &rc) || !ZoneName("top", args, &name, &rc)) {
    return rc;
  }
  double interval = 1;
  if (args.Has("--interval") &&
      (!absl::SimpleAtod(args.Get("--interval", ""), &interval) ||
       !(interval >= 0.2 && interval <= 60))) {
    return UsageError("top", "--interval: give seconds from 0.2 to 60");
  }
  if (!isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO)) {
    return UsageError("top",
                      "needs a terminal; use `trafficrate stat` in "
                      "scripts");
  }
  absl::StatusOr<std::unique_ptr<Zone>> zone = Zone::Attach(name);
  if (!zone.ok()) return Failure(std::string(zone.status().message()));
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  Terminal terminal;
  std::unique_ptr<ZoneSnapshot> before;
  int64_t next = MonotonicNowNs();
  while (!g_stop.load()) {
    absl::StatusOr<ZoneSnapshot> snap = TakeSnapshot(**zone);
    if (!snap.ok()) break;
    const std::string frame =
        FormatTopFrame(*snap, before.get(), Columns(), Rows());
    std::fputs("\033[H\033[2J", stdout);
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
    before = std::make_unique<ZoneSnapshot>(std::move(*snap));
    next += static_cast<int64_t>(interval * kNsPerSec);
    // Wait for the next frame in short slices, so that q and signals are
    // seen at once.
    while (!g_stop.load() && MonotonicNowNs() < next) {
      const int64_t left_ms = (next - MonotonicNowNs()) / kNsPerMs;
      if (QuitPressed(static_cast<int>(std::clamp<int64_t>(left_ms, 1, 100)))) {
        g_stop.store(true);
      }
    }
  }
  return kExitOk;
}

}  // namespace trafficrate
