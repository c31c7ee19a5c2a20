// Write-path microbenchmark (docs/design.md, Targets, "Overhead": an interposed
// write on a governed socket adds <= 50 ns when no share changes). Google
// Benchmark; every case writes to one accepted TCP loopback connection whose
// client end a reader thread drains, so that sends do not block.
//
//   write_path_bench [--benchmark_filter=...] [--benchmark_out=FILE ...]
//
// Cases, each with writes of 0 bytes, 1 byte and 16 KiB:
//   {send,write}/raw            the libc call alone, on the governed socket;
//   {send,write}/governed       Governor::BeforeSend + the call + AfterSend,
//                               as lib/interpose.h's Send() does, with the
//                               key's generation unchanged (the fast path);
//   send/{raw,governed,share_change}_manual
//                               timed per call with CLOCK_MONOTONIC around
//                               the measured part only; share_change first
//                               makes a sibling connection of the same key
//                               join or leave (outside the timed part), so
//                               that BeforeSend must re-apply the share with
//                               setsockopt(SO_MAX_PACING_RATE): the slow path.
//   library/{fast,clock_manual,share_change_manual}
//                               the Governor's part alone, without the call
//                               (whose run-to-run spread on loopback, some
//                               100 ns, hides a 20 ns difference): the fast
//                               path; an empty timed region (the cost of the
//                               manual timing itself); and the slow path.
// Under LD_PRELOAD=libtrafficrate.so (TRAFFICRATE_RATE set) only
//   {send,write}/interposed     the call through the real interposer, on a
//                               socket the library accepted and governs
// run; compare them with the raw cases of a run without it.
//
// The rate is 64 GiB/s (a share of 32 GiB/s with the sibling), far above
// what loopback carries, so that pacing never binds: the figures are the
// library's cost, not its pacing.

#include <arpa/inet.h>
#include <link.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "src/base/clock.h"
#include "src/base/log.h"
#include "src/budget/share.h"
#include "src/runtime/fd_table.h"
#include "src/runtime/governor.h"
#include "src/shm/zone.h"

namespace trafficrate {
namespace {

constexpr uint64_t kRate = uint64_t{64} << 30;  // TRAFFICRATE_RATE=65536m
constexpr int64_t kLongIdleNs = 3600 * kNsPerSec;
constexpr size_t kMaxWrite = 16384;

uint64_t PacingOf(int fd) {
  uint64_t rate = 0;
  socklen_t len = sizeof(rate);
  if (getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, &len) != 0) {
    return 0;
  }
  return len == sizeof(uint32_t) ? static_cast<uint32_t>(rate) : rate;
}

bool TrafficrateLoaded() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, size_t, void*) {
               return std::strstr(info->dlpi_name, "libtrafficrate") != nullptr
                          ? 1
                          : 0;
             },
             nullptr) != 0;
}

void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// One accepted loopback connection; a thread reads its client end until
// EOF.
struct Conn {
  int client = -1;
  int server = -1;
  std::thread reader;
};

// The process-wide set-up, made once: a listener, the measured connection
// and its sibling (same client address, so the same key). Without the
// preloaded library, also a zone, an fd table and a Governor that governs
// both (the benchmark plays the interposers, as the Governor tests do).
class Rig {
 public:
  explicit Rig(bool preloaded) {
    if (!preloaded) {
      zone_name_ = "wpb" + std::to_string(getpid());
      (void)ZoneSegment::Unlink(zone_name_);
      absl::StatusOr<std::unique_ptr<Zone>> zone =
          Zone::OpenOrCreate(zone_name_, uint64_t{1} << 20, kRate);
      if (!zone.ok()) {
        std::fprintf(stderr, "%s\n", zone.status().ToString().c_str());
        std::exit(1);
      }
      zone_ = std::move(*zone);
      table_ = FdTable::Create(65536);
      GovernorOptions options;
      options.idle_ns = kLongIdleNs;  // nobody leaves by idling in the run
      gov_ = std::make_unique<Governor>(zone_.get(), table_, &logger_, options);
    }
    Listen();
    Accept(&measured_);
    Accept(&sibling_);
    if (gov_ != nullptr) {
      // Both join their key: the measured connection's share is rate / 2.
      for (Conn* conn : {&measured_, &sibling_}) {
        gov_->BeforeSend(conn->server);
        const char c = 'j';
        gov_->AfterSend(conn->server,
                        ::send(conn->server, &c, 1, MSG_NOSIGNAL));
      }
      sibling_index_ =
          FdState::From(table_->Get(sibling_.server)->state.load()).conn();
      measured_index_ =
          FdState::From(table_->Get(measured_.server)->state.load()).conn();
    }
  }

  ~Rig() {
    for (Conn* conn : {&measured_, &sibling_}) {
      if (gov_ != nullptr) gov_->OnClose(conn->server);
      close(conn->server);  // the reader sees EOF
      conn->reader.join();
      close(conn->client);
    }
    close(listener_);
    if (gov_ != nullptr) {
      gov_->StopWatcher();
      gov_.reset();
      (void)ZoneSegment::Unlink(zone_name_);
    }
  }

  int fd() const { return measured_.server; }
  Governor* gov() const { return gov_.get(); }
  // The pacing the measured connection's zone slot says was applied.
  uint64_t AppliedShare() const {
    return zone_->conns()
        .slot(measured_index_)
        .share_bytes_per_sec.load(std::memory_order_relaxed);
  }
  // Makes the sibling join (true) or leave (false) its key, as another
  // process's connection of the key would: the key's generation moves, and
  // no watcher is woken, so the next send on fd() applies the new share.
  bool SetSiblingJoined(bool joined) {
    ZoneLock lock(*zone_);
    if (!lock.ok()) return false;
    return joined ? zone_->conns().JoinLocked(sibling_index_)
                  : zone_->conns().LeaveLocked(sibling_index_);
  }

 private:
  void Listen() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    addr_ = sockaddr_in{};
    addr_.sin_family = AF_INET;
    addr_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr_);
    if (listener_ < 0 ||
        bind(listener_, reinterpret_cast<sockaddr*>(&addr_), len) != 0 ||
        listen(listener_, 16) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr_), &len) !=
            0) {
      Die("listen");
    }
  }

  // Connects and accepts with ::accept: under LD_PRELOAD the library's
  // interposer sees it and governs the server end.
  void Accept(Conn* conn) {
    conn->client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (conn->client < 0 ||
        connect(conn->client, reinterpret_cast<const sockaddr*>(&addr_),
                sizeof(addr_)) != 0) {
      Die("connect");
    }
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    conn->server =
        ::accept(listener_, reinterpret_cast<sockaddr*>(&peer), &len);
    if (conn->server < 0) Die("accept");
    if (gov_ != nullptr) {
      gov_->OnAccept(conn->server, reinterpret_cast<sockaddr*>(&peer), len);
    }
    const int client = conn->client;
    conn->reader = std::thread([client] {
      std::vector<char> buf(1 << 18);
      while (::recv(client, buf.data(), buf.size(), 0) > 0) {
      }
    });
  }

  Logger logger_;
  std::string zone_name_;
  std::unique_ptr<Zone> zone_;
  FdTable* table_ = nullptr;  // never freed, as in the library
  std::unique_ptr<Governor> gov_;
  int listener_ = -1;
  sockaddr_in addr_{};
  Conn measured_;
  Conn sibling_;
  uint32_t measured_index_ = kNoSlot;
  uint32_t sibling_index_ = kNoSlot;
};

Rig* g_rig = nullptr;
char g_data[kMaxWrite];

enum class Call { kSend, kWrite };

inline ssize_t Write(Call call, int fd, size_t bytes) {
  return call == Call::kSend ? ::send(fd, g_data, bytes, MSG_NOSIGNAL)
                             : ::write(fd, g_data, bytes);
}

// Counts calls that did not write everything (they would make the case
// cheaper than it is); any is reported as an error.
void CheckShort(benchmark::State& state, int64_t short_writes) {
  if (short_writes > 0) {
    state.SkipWithError(
        (std::to_string(short_writes) + " short or failed writes").c_str());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// {send,write}/raw, and {send,write}/interposed under LD_PRELOAD.
void BM_Raw(benchmark::State& state, Call call) {
  const int fd = g_rig->fd();
  const size_t bytes = static_cast<size_t>(state.range(0));
  int64_t short_writes = 0;
  for (auto _ : state) {
    short_writes += Write(call, fd, bytes) != static_cast<ssize_t>(bytes);
  }
  CheckShort(state, short_writes);
}

void BM_Interposed(benchmark::State& state, Call call) {
  BM_Raw(state, call);
  // The library applied its share (the whole rate: the sibling never sent)
  // on the first send; if not, the socket was not governed.
  if (PacingOf(g_rig->fd()) != kRate) {
    state.SkipWithError("the socket is not paced at TRAFFICRATE_RATE=65536m");
  }
}

// {send,write}/governed: what lib/interpose.h's Send() does around the
// call, on the fast path.
void BM_Governed(benchmark::State& state, Call call) {
  const int fd = g_rig->fd();
  Governor& gov = *g_rig->gov();
  const size_t bytes = static_cast<size_t>(state.range(0));
  gov.BeforeSend(fd);  // applies any change left by another case
  int64_t short_writes = 0;
  for (auto _ : state) {
    gov.BeforeSend(fd);
    const ssize_t sent = Write(call, fd, bytes);
    gov.AfterSend(fd, sent);
    short_writes += sent != static_cast<ssize_t>(bytes);
  }
  CheckShort(state, short_writes);
  if (PacingOf(fd) != ShareBytesPerSec(kRate, 2)) {
    state.SkipWithError("the socket is not paced at its share");
  }
}

enum class Path { kRaw, kGoverned, kShareChange };

// share_change: the sibling joins or leaves before each timed call, so the
// next send must re-apply the share; false (the benchmark skipped) if the
// zone refused. Other paths: nothing to do.
bool FlipSibling(benchmark::State& state, Path path, bool* joined) {
  if (path != Path::kShareChange) return true;
  *joined = !*joined;
  if (g_rig->SetSiblingJoined(*joined)) return true;
  state.SkipWithError("the sibling's join or leave failed");
  return false;
}

// send/*_manual: only the call (and the Governor's part around it) is timed,
// so that the sibling's join or leave before it is not.
void BM_Manual(benchmark::State& state, Path path) {
  const int fd = g_rig->fd();
  Governor& gov = *g_rig->gov();
  const size_t bytes = static_cast<size_t>(state.range(0));
  gov.BeforeSend(fd);
  bool sibling_joined = true;
  int64_t short_writes = 0;
  int64_t applied = 0;
  for (auto _ : state) {
    if (!FlipSibling(state, path, &sibling_joined)) break;
    const int64_t start_ns = MonotonicNowNs();
    if (path != Path::kRaw) gov.BeforeSend(fd);
    const ssize_t sent = ::send(fd, g_data, bytes, MSG_NOSIGNAL);
    if (path != Path::kRaw) gov.AfterSend(fd, sent);
    const int64_t end_ns = MonotonicNowNs();
    state.SetIterationTime(static_cast<double>(end_ns - start_ns) * 1e-9);
    short_writes += sent != static_cast<ssize_t>(bytes);
    applied += g_rig->AppliedShare() ==
               ShareBytesPerSec(kRate, sibling_joined ? 2 : 1);
  }
  if (!sibling_joined) g_rig->SetSiblingJoined(true);
  CheckShort(state, short_writes);
  // share_change: 1 if every send applied the new share itself (the
  // watcher, never woken, did not do it first).
  state.counters["applied"] = benchmark::Counter(
      static_cast<double>(applied), benchmark::Counter::kAvgIterations);
}

// library/fast: BeforeSend + AfterSend of a 16 KiB send, no call.
void BM_LibraryFast(benchmark::State& state) {
  const int fd = g_rig->fd();
  Governor& gov = *g_rig->gov();
  gov.BeforeSend(fd);
  for (auto _ : state) {
    gov.BeforeSend(fd);
    gov.AfterSend(fd, kMaxWrite);
  }
}

// library/{clock,share_change}_manual: nothing, or BeforeSend (which
// re-applies the share) + AfterSend after the sibling's join or leave.
void BM_LibraryManual(benchmark::State& state, Path path) {
  const int fd = g_rig->fd();
  Governor& gov = *g_rig->gov();
  gov.BeforeSend(fd);
  bool sibling_joined = true;
  int64_t applied = 0;
  for (auto _ : state) {
    if (!FlipSibling(state, path, &sibling_joined)) break;
    const int64_t start_ns = MonotonicNowNs();
    if (path != Path::kRaw) {
      gov.BeforeSend(fd);
      gov.AfterSend(fd, kMaxWrite);
    }
    const int64_t end_ns = MonotonicNowNs();
    state.SetIterationTime(static_cast<double>(end_ns - start_ns) * 1e-9);
    applied += g_rig->AppliedShare() ==
               ShareBytesPerSec(kRate, sibling_joined ? 2 : 1);
  }
  if (!sibling_joined) g_rig->SetSiblingJoined(true);
  state.counters["applied"] = benchmark::Counter(
      static_cast<double>(applied), benchmark::Counter::kAvgIterations);
}

void Sizes(benchmark::internal::Benchmark* b) {
  // 0 bytes: the syscall still runs (and returns 0) but is cheap and steady,
  // so the difference to raw shows through.
  b->Arg(0)->Arg(1)->Arg(static_cast<int64_t>(kMaxWrite));
}

void RegisterPlain() {
  for (auto [name, call] :
       {std::pair{"send", Call::kSend}, std::pair{"write", Call::kWrite}}) {
    const std::string n = name;
    benchmark::RegisterBenchmark((n + "/raw").c_str(), BM_Raw, call)
        ->Apply(Sizes);
    benchmark::RegisterBenchmark((n + "/governed").c_str(), BM_Governed, call)
        ->Apply(Sizes);
  }
  for (auto [name, path] :
       {std::pair{"send/raw_manual", Path::kRaw},
        std::pair{"send/governed_manual", Path::kGoverned},
        std::pair{"send/share_change_manual", Path::kShareChange}}) {
    benchmark::RegisterBenchmark(name, BM_Manual, path)
        ->Apply(Sizes)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark("library/fast", BM_LibraryFast);
  benchmark::RegisterBenchmark("library/clock_manual", BM_LibraryManual,
                               Path::kRaw)
      ->UseManualTime();
  benchmark::RegisterBenchmark("library/share_change_manual", BM_LibraryManual,
                               Path::kShareChange)
      ->UseManualTime();
}

void RegisterPreloaded() {
  benchmark::RegisterBenchmark("send/interposed", BM_Interposed, Call::kSend)
      ->Apply(Sizes);
  benchmark::RegisterBenchmark("write/interposed", BM_Interposed, Call::kWrite)
      ->Apply(Sizes);
}

}  // namespace
}  // namespace trafficrate

int main(int argc, char** argv) {
  using namespace trafficrate;  // NOLINT(build/namespaces): main only
  std::memset(g_data, 'd', sizeof(g_data));
  const bool preloaded = TrafficrateLoaded();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  if (preloaded) {
    RegisterPreloaded();
  } else {
    RegisterPlain();
  }
  benchmark::AddCustomContext("trafficrate",
                              preloaded ? "preloaded" : "in-process Governor");
  {
    Rig rig(preloaded);
    g_rig = &rig;
    benchmark::RunSpecifiedBenchmarks();
    g_rig = nullptr;
  }
  benchmark::Shutdown();
  return 0;
}
