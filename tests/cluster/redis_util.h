// A real redis-server (Debian's) for the tests of the cluster exchange and
// agent: started on a free loopback port by each test, stopped by pid.

#ifndef TRAFFICRATE_TESTS_REDIS_UTIL_H_
#define TRAFFICRATE_TESTS_REDIS_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/config/cluster_url.h"

extern char** environ;

namespace trafficrate {
namespace testing_util {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// redis-server on 127.0.0.1:port, no persistence.
class RedisServer {
 public:
  explicit RedisServer(int port, const std::string& password = "")
      : port_(port) {
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     "/dev/null"};
    if (!password.empty()) {
      args.push_back("--requirepass");
      args.push_back(password);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // Not the test's stdout or stderr: a test that crashes would leave a
    // server holding its pipes.
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawnp(&pid_, "redis-server", &actions, nullptr,
                                argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      ADD_FAILURE() << "cannot start redis-server (apt-get install "
                       "redis-server): "
                    << strerror(rc);
      return;
    }
    // Ready when it accepts a connection (at most 5 s).
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline && !Accepts()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(Accepts()) << "redis-server did not listen on " << port;
  }
  ~RedisServer() { Stop(); }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  bool Accepts() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  }

  int port_;
  pid_t pid_ = -1;
};

// redis://127.0.0.1:port (with the password, if any).
inline ClusterUrl RedisUrl(int port, const std::string& password = "") {
  ClusterUrl url;
  url.host = "127.0.0.1";
  url.port = port;
  url.password = password;
  return url;
}

}  // namespace testing_util
}  // namespace trafficrate

#endif  // TRAFFICRATE_TESTS_REDIS_UTIL_H_
