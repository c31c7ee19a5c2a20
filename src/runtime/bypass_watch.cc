#include "src/runtime/bypass_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "src/base/clock.h"
#include "src/base/elf_probe.h"
#include "src/base/library_thread.h"
#include "src/base/log.h"

namespace trafficrate {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kReceiveBytes = 32 * 1024;
constexpr int kReceiveTimeoutSec = 1;

// The states of a connection still open on the server's side (from
// <netinet/tcp.h>'s TCP_ESTABLISHED...): not SYN_SENT (a client's), not
// TIME_WAIT or CLOSE (no socket file), not LISTEN.
constexpr uint32_t kOpenStates =
    (1u << TCP_ESTABLISHED) | (1u << TCP_FIN_WAIT1) | (1u << TCP_FIN_WAIT2) |
    (1u << TCP_CLOSE_WAIT) | (1u << TCP_LAST_ACK) | (1u << TCP_CLOSING);

// A sock_diag dump request of the TCP sockets of one family whose local
// port is `port`: the kernel runs the bytecode (port >= P and port <= P,
// kernels before 4.17 have no S_EQ) on every socket and returns matches.
struct DiagRequest {
  nlmsghdr header;
  inet_diag_req_v2 request;
  nlattr bytecode_attr;
  inet_diag_bc_op bytecode[4];
};

DiagRequest MakeRequest(const ListenAddr& listener) {
  DiagRequest r{};
  r.header.nlmsg_len = sizeof(r);
  r.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  r.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  r.header.nlmsg_seq = 1;
  r.request.sdiag_family = static_cast<uint8_t>(listener.family);
  r.request.sdiag_protocol = IPPROTO_TCP;
  r.request.idiag_states = kOpenStates;
  r.bytecode_attr.nla_len = sizeof(r.bytecode_attr) + sizeof(r.bytecode);
  r.bytecode_attr.nla_type = INET_DIAG_REQ_BYTECODE;
  // {op, yes, no}: "yes" goes on to the next op (8 bytes on), "no" jumps
  // past the end plus 4, which rejects; past the end exactly accepts.
  r.bytecode[0] = {INET_DIAG_BC_S_GE, 8, 20};
  r.bytecode[1] = {0, 0, listener.port};
  r.bytecode[2] = {INET_DIAG_BC_S_LE, 8, 12};
  r.bytecode[3] = {0, 0, listener.port};
  return r;
}

bool SameAddress(const ListenAddr& listener, const inet_diag_sockid& id) {
  if (listener.any) return true;
  const size_t len = listener.family == AF_INET ? 4 : 16;
  return std::memcmp(listener.addr, id.idiag_src, len) == 0;
}

// Adds the matching sockets of one receive buffer to `inodes`; true at the
// end of the dump. An error for a netlink error message.
absl::StatusOr<bool> TakeMessages(const char* buf, size_t len,
                                  const ListenAddr& listener, size_t max,
                                  std::vector<uint64_t>* inodes) {
  int remaining = static_cast<int>(len);
  for (const nlmsghdr* h = reinterpret_cast<const nlmsghdr*>(buf);
       NLMSG_OK(h, remaining); h = NLMSG_NEXT(h, remaining)) {
    if (h->nlmsg_type == NLMSG_DONE) return true;
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      const int error = h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error < 0
                            ? -e->error
                            : EPROTO;
      return absl::ErrnoToStatus(error, "sock_diag");
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
        h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      continue;
    }
    const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
    if (m->idiag_inode != 0 && ntohs(m->id.idiag_sport) == listener.port &&
        SameAddress(listener, m->id) && inodes->size() < max) {
      inodes->push_back(m->idiag_inode);
    }
  }
  return false;
}

}  // namespace

bool LogIfGoProgram(const Logger& logger, const char* exe) {
  absl::StatusOr<ProgramInfo> info = InspectProgram(exe);
  if (!info.ok() || !info->go) return false;
  char path[512];
  const ssize_t n = readlink(exe, path, sizeof(path) - 1);
  path[n > 0 ? n : 0] = '\0';
  logger.Warning(
      "process %d (%s) %s, so trafficrate cannot pace its connections (%s)",
      static_cast<int>(getpid()), n > 0 ? path : exe, WhyNotPaced(*info),
      kBypassHelp);
  return true;
}

absl::StatusOr<std::vector<uint64_t>> OpenConnectionInodes(
    const ListenAddr& listener, size_t max) {
  const int fd =
      socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket(NETLINK_SOCK_DIAG)");
  const timeval timeout{kReceiveTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const DiagRequest request = MakeRequest(listener);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, &request, sizeof(request), 0,
             reinterpret_cast<const sockaddr*>(&kernel),
             sizeof(kernel)) != static_cast<ssize_t>(sizeof(request))) {
    const int error = errno;
    close(fd);
    return absl::ErrnoToStatus(error, "sock_diag request");
  }
  std::vector<uint64_t> inodes;
  std::vector<char> buf(kReceiveBytes);
  for (;;) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EPROTO;
      close(fd);
      return absl::ErrnoToStatus(error, "sock_diag dump");
    }
    absl::StatusOr<bool> done = TakeMessages(buf.data(), static_cast<size_t>(n),
                                             listener, max, &inodes);
    if (!done.ok() || *done) {
      close(fd);
      if (!done.ok()) return done.status();
      break;
    }
  }
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

std::vector<uint64_t> OwnedSockets(const std::vector<uint64_t>& inodes,
                                   size_t limit) {
  std::vector<uint64_t> owned;
  if (inodes.empty() || limit == 0) return owned;
  // The fd numbers from /proc/self/fd (many per getdents), the inode of
  // each by stat through its link: cheaper than reading each link.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return owned;
  const int dir_fd = dirfd(dir);
  while (owned.size() < limit) {
    const dirent* entry = readdir(dir);
    if (entry == nullptr) break;
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    struct stat st {};
    // Through the link, not fstat(fd): the host's fds are only named here.
    if (end == entry->d_name || *end != '\0' || fd == dir_fd ||
        fstatat(dir_fd, entry->d_name, &st, 0) != 0 || !S_ISSOCK(st.st_mode)) {
      continue;
    }
    if (std::binary_search(inodes.begin(), inodes.end(), st.st_ino)) {
      owned.push_back(st.st_ino);
    }
  }
  closedir(dir);
  std::sort(owned.begin(), owned.end());
  return owned;
}

ListenWatch::ListenWatch(const Logger* logger, const ListenWatchTiming& timing,
                         void (*thread_start)())
    : logger_(logger), timing_(timing), thread_start_(thread_start) {}

void ListenWatch::OnListen(int fd) {
  if (accepted_.load(std::memory_order_relaxed) ||
      state_.load(std::memory_order_relaxed) >= kDone ||
      listeners_.load(std::memory_order_relaxed) >= kMaxListeners) {
    return;
  }
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  int protocol = 0;
  socklen_t protocol_len = sizeof(protocol);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
      (local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
      getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &protocol_len) != 0 ||
      protocol != IPPROTO_TCP) {
    return;
  }
  ListenAddr addr;
  addr.family = local.ss_family;
  if (local.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&local);
    addr.port = ntohs(in->sin_port);
    addr.any = in->sin_addr.s_addr == htonl(INADDR_ANY);
    std::memcpy(addr.addr, &in->sin_addr, 4);
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&local);
    addr.port = ntohs(in6->sin6_port);
    addr.any = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
    std::memcpy(addr.addr, &in6->sin6_addr, 16);
  }
  const int slot = listeners_.fetch_add(1, std::memory_order_acq_rel);
  if (slot >= kMaxListeners) return;
  slots_[slot].addr = addr;
  slots_[slot].ready.store(true, std::memory_order_release);
  int expected = kIdle;
  if (!state_.compare_exchange_strong(expected, kLooking)) return;
  pthread_t thread;
  if (StartLibraryThread(&thread, &Main, this, kStackBytes,
                         /*detached=*/true) != 0) {
    state_.store(kFailed, std::memory_order_relaxed);
  }
}

void ListenWatch::AfterForkChild() {
  for (Slot& s : slots_) s.ready.store(false, std::memory_order_relaxed);
  listeners_.store(0, std::memory_order_relaxed);
  state_.store(kIdle, std::memory_order_relaxed);
}

void* ListenWatch::Main(void* self) {
  auto* watch = static_cast<ListenWatch*>(self);
  if (watch->thread_start_ != nullptr) watch->thread_start_();
  pthread_setname_np(pthread_self(), "trafficrate-l");
  watch->Run();
  return nullptr;
}

void ListenWatch::Run() {
  int64_t wait_ns = timing_.first_ns;
  for (int look = 0; look < timing_.looks; ++look) {
    const Clock& clock = *timing_.clock;
    const int64_t deadline = clock.NowNs() + wait_ns;
    for (int64_t now = clock.NowNs(); now < deadline; now = clock.NowNs()) {
      clock.SleepNs(deadline - now);
    }
    if (LookOnce() != Look::kNothingYet) break;
    wait_ns *= 2;
  }
  // For the life of the process: later listens start nothing.
  state_.store(kDone, std::memory_order_release);
}

std::vector<ListenAddr> ListenWatch::Listeners() const {
  std::vector<ListenAddr> out;
  const int n =
      std::min(listeners_.load(std::memory_order_acquire), kMaxListeners);
  for (int i = 0; i < n; ++i) {
    if (!slots_[i].ready.load(std::memory_order_acquire)) continue;
    const ListenAddr& a = slots_[i].addr;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const auto& b) {
      return a.family == b.family && a.port == b.port && a.any == b.any &&
             std::memcmp(a.addr, b.addr, sizeof(a.addr)) == 0;
    });
    if (!seen) out.push_back(a);
  }
  return out;
}

ListenWatch::Look ListenWatch::LookOnce() {
  bool others = false;
  for (const ListenAddr& listener : Listeners()) {
    if (accepted_.load(std::memory_order_relaxed)) return Look::kAccepted;
    absl::StatusOr<std::vector<uint64_t>> inodes =
        OpenConnectionInodes(listener, kMaxConnections);
    if (!inodes.ok()) return Look::kCannotTell;
    if (inodes->empty()) continue;
    others = true;
    if (OwnedSockets(*inodes, 1).empty()) continue;
    // An accept() that returned while we looked counts.
    if (accepted_.load(std::memory_order_acquire)) return Look::kAccepted;
    logger_->Warning(
        "process %d holds connections on port %u that no accept() or "
        "accept4() call returned (accepted through io_uring or a raw system "
        "call?): trafficrate cannot pace them (%s)",
        static_cast<int>(getpid()), static_cast<unsigned>(listener.port),
        kBypassHelp);
    return Look::kUnaccepted;
  }
  if (accepted_.load(std::memory_order_relaxed)) return Look::kAccepted;
  return others ? Look::kOthers : Look::kNothingYet;
}

}  // namespace trafficrate
