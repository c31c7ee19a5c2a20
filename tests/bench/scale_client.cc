// Scale client for bench/scenarios.py's scale scenario: holds many HTTP
// downloads open at once and counts their bytes, at a cost a Python client
// could not keep up with at 50 000 connections.
//
//   scale_client --port P --path /big.bin --sources A.B.C.D --nsources S
//                [--host 127.0.0.1] [--first G]
//
// Connection g (counted from --first over all client processes) comes from
// source address number g % S, counting up from A.B.C.D and skipping the
// addresses that end in .0 or .255. Commands, one per line on stdin, answered
// one line each on stdout:
//
//   open N   opens connections until this process holds N (at most 512
//            connecting at a time); answers "opened HELD FAILED SECONDS" once
//            none is still connecting
//   mark     answers "mark MONOTONIC_NS TOTAL_BYTES HELD FAILED BAD_STATUS"
//   sources  answers "sources B0 B1 ..." (bytes per source address so far)
//   conns    answers "conns B0 B1 ..." (bytes per connection so far)
//   quit     closes everything and exits
//
// Bytes are everything read, response headers included (a few hundred bytes
// per connection, read before any measuring window). A connection that ends
// or fails counts in FAILED and is not reopened.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kMaxConnecting = 512;
// Once every connection is open, reads come in rounds this far apart.
constexpr int64_t kReadRoundNs = 250'000'000;
constexpr uint64_t kStdinTag = ~uint64_t{0};

enum class State : uint8_t { kConnecting, kReading, kDone };

struct Conn {
  int fd = -1;
  State state = State::kConnecting;
  bool status_checked = false;
  uint64_t bytes = 0;
  uint32_t source = 0;
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string path = "/big.bin";
  uint32_t first_source = 0;  // host order
  uint32_t nsources = 1;
  uint64_t first = 0;
};

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The n-th usable address from first: x.y.z.0 and x.y.z.255 are left out.
uint32_t SourceAddress(uint32_t first, uint32_t n) {
  uint32_t addr = first;
  // 254 usable per /24 block; step whole blocks, then within one.
  const uint32_t start = addr & 0xff;
  uint32_t offset = (start == 0 ? 0 : start - 1) + n;
  addr = (addr & ~uint32_t{0xff}) + (offset / 254) * 256 + 1 + offset % 254;
  return addr;
}

class Client {
 public:
  explicit Client(const Options& opt) : opt_(opt) {
    request_ = "GET " + opt.path + " HTTP/1.1\r\nHost: " + opt.host +
               "\r\nUser-Agent: scale_client\r\n\r\n";
    per_source_.assign(opt.nsources, 0);
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kStdinTag;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, 0, &ev);
    server_.sin_family = AF_INET;
    server_.sin_port = htons(static_cast<uint16_t>(opt.port));
    inet_pton(AF_INET, opt.host.c_str(), &server_.sin_addr);
  }

  int Run() {
    std::vector<epoll_event> events(1024);
    int64_t round_start = 0;
    bool more = false;  // the last epoll_wait filled the array
    for (;;) {
      StartDue();
      int timeout_ms = 100;
      if (!open_pending_ && connecting_ == 0 && !more) {
        // Every connection open: read in rounds kReadRoundNs apart, so
        // that each recv takes what a connection received meanwhile (at
        // low rates the server's pieces are a few hundred bytes, and a
        // recv of each would make these processes take more of the CPU
        // than the server they measure).
        const int64_t wait = round_start + kReadRoundNs - NowNs();
        if (wait > 0) {
          const timespec ts{static_cast<time_t>(wait / 1'000'000'000),
                            static_cast<long>(wait % 1'000'000'000)};
          nanosleep(&ts, nullptr);
        }
        timeout_ms = 0;
      }
      if (!more) round_start = NowNs();
      const int n = epoll_wait(epfd_, events.data(),
                               static_cast<int>(events.size()), timeout_ms);
      if (n < 0 && errno != EINTR) return 1;
      more = n == static_cast<int>(events.size());
      for (int i = 0; i < n; ++i) {
        if (events[i].data.u64 == kStdinTag) {
          if (!ReadCommands()) return 0;
          continue;
        }
        Handle(static_cast<size_t>(events[i].data.u64), events[i].events);
      }
      if (open_pending_ && connecting_ == 0 && next_ >= want_) {
        open_pending_ = false;
        std::printf("opened %zu %zu %.3f\n", held_, failed_,
                    (NowNs() - open_started_) / 1e9);
        std::fflush(stdout);
      }
    }
  }

 private:
  void StartDue() {
    while (next_ < want_ && connecting_ < kMaxConnecting) {
      const uint64_t g = opt_.first + next_;
      Conn c;
      c.source = static_cast<uint32_t>(g % opt_.nsources);
      c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      ++next_;
      if (c.fd < 0) {
        ++failed_;
        conns_.push_back(c);
        conns_.back().state = State::kDone;
        continue;
      }
      const int one = 1;
      setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr = htonl(SourceAddress(opt_.first_source, c.source));
      if (bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
          (connect(c.fd, reinterpret_cast<sockaddr*>(&server_),
                   sizeof(server_)) != 0 &&
           errno != EINPROGRESS)) {
        close(c.fd);
        c.fd = -1;
        c.state = State::kDone;
        ++failed_;
        conns_.push_back(c);
        continue;
      }
      conns_.push_back(c);
      epoll_event ev{};
      ev.events = EPOLLOUT | EPOLLIN;
      ev.data.u64 = conns_.size() - 1;
      epoll_ctl(epfd_, EPOLL_CTL_ADD, c.fd, &ev);
      ++connecting_;
    }
  }

  void Fail(Conn& c) {
    if (c.state == State::kConnecting) --connecting_;
    if (c.state == State::kReading) --held_;
    if (c.fd >= 0) close(c.fd);  // also leaves the epoll set
    c.fd = -1;
    c.state = State::kDone;
    ++failed_;
  }

  void Handle(size_t index, uint32_t events) {
    Conn& c = conns_[index];
    if (c.state == State::kDone) return;
    if (c.state == State::kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) return Fail(c);
      if (!(events & EPOLLOUT)) return;
      if (send(c.fd, request_.data(), request_.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request_.size())) {
        return Fail(c);
      }
      c.state = State::kReading;
      --connecting_;
      ++held_;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = index;
      epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
      return;
    }
    for (int round = 0; round < 4; ++round) {
      const ssize_t got = recv(c.fd, buf_, sizeof(buf_), 0);
      if (got > 0) {
        if (!c.status_checked) {
          c.status_checked = true;
          if (got < 12 || std::memcmp(buf_, "HTTP/1.1 200", 12) != 0) {
            ++bad_status_;
          }
        }
        c.bytes += static_cast<uint64_t>(got);
        per_source_[c.source] += static_cast<uint64_t>(got);
        total_ += static_cast<uint64_t>(got);
        if (got < static_cast<ssize_t>(sizeof(buf_))) return;
        continue;
      }
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return Fail(c);  // the server closed it, or an error
    }
  }

  // False on "quit" or end of input.
  bool ReadCommands() {
    char chunk[4096];
    const ssize_t got = read(0, chunk, sizeof(chunk));
    if (got <= 0) return false;
    line_.append(chunk, static_cast<size_t>(got));
    size_t nl;
    while ((nl = line_.find('\n')) != std::string::npos) {
      const std::string cmd = line_.substr(0, nl);
      line_.erase(0, nl + 1);
      if (cmd.rfind("open ", 0) == 0) {
        want_ = std::max<uint64_t>(want_,
                                   std::strtoull(cmd.c_str() + 5, nullptr, 10));
        open_pending_ = true;
        open_started_ = NowNs();
      } else if (cmd == "mark") {
        std::printf("mark %lld %llu %zu %zu %zu\n",
                    static_cast<long long>(NowNs()),
                    static_cast<unsigned long long>(total_), held_, failed_,
                    bad_status_);
      } else if (cmd == "sources" || cmd == "conns") {
        std::string out = cmd;
        char num[24];
        if (cmd == "sources") {
          for (uint64_t b : per_source_) {
            std::snprintf(num, sizeof(num), " %llu",
                          static_cast<unsigned long long>(b));
            out += num;
          }
        } else {
          for (const Conn& c : conns_) {
            std::snprintf(num, sizeof(num), " %llu",
                          static_cast<unsigned long long>(c.bytes));
            out += num;
          }
        }
        std::puts(out.c_str());
      } else if (cmd == "quit") {
        return false;
      } else {
        std::printf("error unknown command: %s\n", cmd.c_str());
      }
      std::fflush(stdout);
    }
    return true;
  }

  Options opt_;
  std::string request_;
  sockaddr_in server_{};
  int epfd_ = -1;
  std::vector<Conn> conns_;
  std::vector<uint64_t> per_source_;
  uint64_t want_ = 0;
  uint64_t next_ = 0;
  int connecting_ = 0;
  size_t held_ = 0;
  size_t failed_ = 0;
  size_t bad_status_ = 0;
  uint64_t total_ = 0;
  bool open_pending_ = false;
  int64_t open_started_ = 0;
  std::string line_;
  char buf_[65536];
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "scale_client: %s\nusage: scale_client --port P [--host ADDR] "
               "[--path /file] [--sources A.B.C.D] [--nsources S] "
               "[--first G]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  in_addr first{};
  inet_pton(AF_INET, "127.0.1.1", &first);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return Usage("an option without a value");
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--port") {
      opt.port = std::atoi(value);
    } else if (flag == "--host") {
      opt.host = value;
    } else if (flag == "--path") {
      opt.path = value;
    } else if (flag == "--sources") {
      if (inet_pton(AF_INET, value, &first) != 1) {
        return Usage("--sources takes an IPv4 address");
      }
    } else if (flag == "--nsources") {
      opt.nsources = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
    } else if (flag == "--first") {
      opt.first = std::strtoull(value, nullptr, 10);
    } else {
      return Usage(("unknown option " + flag).c_str());
    }
  }
  if (opt.port <= 0 || opt.port > 65535) return Usage("--port is required");
  if (opt.nsources == 0) return Usage("--nsources must be at least 1");
  opt.first_source = ntohl(first.s_addr);
  static Client client(opt);  // its 64 KiB buffer stays off the stack
  return client.Run();
}
