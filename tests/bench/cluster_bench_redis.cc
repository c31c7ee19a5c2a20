#include "tests/bench/cluster_bench_redis.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trafficrate {
namespace cluster_bench {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 &&
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

uint64_t RequestBytes(const std::vector<std::string>& words) {
  auto header = [](char kind, size_t n) {
    return 1 + std::to_string(n).size() + 2 + (kind == '$' ? n + 2 : 0);
  };
  uint64_t bytes = header('*', words.size());
  for (const std::string& w : words) bytes += header('$', w.size());
  return bytes;
}

uint64_t BulkReplyBytes(size_t n) {
  return 1 + std::to_string(n).size() + 2 + n + 2;
}

const std::vector<std::string>& InfoCommand() {
  static const auto* words =
      new std::vector<std::string>{"INFO", "server", "stats", "commandstats"};
  return *words;
}

RedisStats ReadStats(RedisClient& redis) {
  RedisStats s;
  const std::string text = redis.Bulk(InfoCommand());
  s.reply_bytes = BulkReplyBytes(text.size());
  int found = 0;
  for (absl::string_view line : absl::StrSplit(text, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = line.substr(colon + 1);
    if (name == "total_commands_processed") {
      found += absl::SimpleAtoi(value, &s.commands);
    } else if (name == "total_net_input_bytes") {
      found += absl::SimpleAtoi(value, &s.net_in);
    } else if (name == "total_net_output_bytes") {
      found += absl::SimpleAtoi(value, &s.net_out);
    } else if (name == "redis_version") {
      s.version = std::string(value);
    } else {
      // cmdstat_NAME:calls=N,usec=...
      absl::string_view command = name;
      if (!absl::ConsumePrefix(&command, "cmdstat_")) continue;
      absl::string_view calls = value;
      if (!absl::ConsumePrefix(&calls, "calls=")) continue;
      calls = calls.substr(0, calls.find(','));
      uint64_t n = 0;
      if (absl::SimpleAtoi(calls, &n)) s.calls[std::string(command)] = n;
    }
  }
  s.ok = found == 3;
  return s;
}

}  // namespace cluster_bench
}  // namespace trafficrate
