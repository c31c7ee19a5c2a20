#include "src/cluster/cluster_exchange.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>
#include <unistd.h>

#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace trafficrate {
namespace {

// What is read from Redis is not trusted: at most this many hosts are kept,
// of each only the figures of this host's keys, and malformed figures are
// skipped.
constexpr size_t kMaxHosts = 256;
// More sending connections than any zone holds.
constexpr uint32_t kMaxConnections = 1 << 24;
// Not a ClusterKeyName (those start "trafficrate:").
constexpr char kHeartbeatField[] = ".";

timeval RedisTimeout(absl::Duration d) {
  if (d < absl::Milliseconds(1)) d = absl::Milliseconds(1);
  return absl::ToTimeval(d);
}

// A command's words as hiredis takes them.
struct Argv {
  explicit Argv(const std::vector<std::string>& words) {
    for (const std::string& w : words) {
      argv.push_back(w.data());
      lens.push_back(w.size());
    }
  }
  int argc() const { return static_cast<int>(argv.size()); }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
};

// One reply, owned.
struct Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r != nullptr) freeReplyObject(r);
  }
};

// "DEMAND CONNECTIONS" (HMGET's reply for one field): false if absent or
// malformed.
bool ParseFigures(const redisReply* value, KeyFigures* k) {
  if (value == nullptr || value->type != REDIS_REPLY_STRING) return false;
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(value->str, value->len), ' ');
  return parts.size() == 2 && absl::SimpleAtod(parts[0], &k->demand) &&
         absl::SimpleAtoi(parts[1], &k->connections) && k->demand >= 0 &&
         k->connections <= kMaxConnections;
}

}  // namespace

ClusterExchange::ClusterExchange(ClusterUrl url, std::string zone,
                                 std::string host_id, int64_t ttl_ms)
    : url_(std::move(url)),
      zone_(std::move(zone)),
      host_id_(std::move(host_id)),
      ttl_ms_(ttl_ms) {
  std::random_device random;
  instance_ = absl::StrFormat("%08x%08x", random(), random());
}

ClusterExchange::~ClusterExchange() { Drop(); }

void ClusterExchange::ForgetAfterFork() {
  if (context_ != nullptr && context_->fd >= 0) close(context_->fd);
  context_ = nullptr;
}

void ClusterExchange::Drop() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status ClusterExchange::Connect(absl::Duration timeout) {
  redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port,
                                            RedisTimeout(timeout));
  if (c == nullptr || c->err != 0) {
    const std::string why = c == nullptr ? "out of memory" : c->errstr;
    if (c != nullptr) redisFree(c);
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to ", DescribeClusterUrl(url_), ": ", why));
  }
  context_ = c;
  if (redisSetTimeout(c, RedisTimeout(timeout)) != REDIS_OK) {
    Drop();
    return absl::UnavailableError("cannot set the Redis socket timeout");
  }
  std::vector<std::vector<std::string>> setup;
  if (!url_.password.empty()) {
    setup.push_back(
        url_.user.empty()
            ? std::vector<std::string>{"AUTH", url_.password}
            : std::vector<std::string>{"AUTH", url_.user, url_.password});
  }
  if (url_.db != 0) setup.push_back({"SELECT", absl::StrCat(url_.db)});
  for (const std::vector<std::string>& command : setup) {
    Argv a(command);
    Reply reply;
    reply.r = static_cast<redisReply*>(
        redisCommandArgv(c, a.argc(), a.argv.data(), a.lens.data()));
    if (reply.r == nullptr) {
      const std::string why = c->errstr;
      Drop();
      return absl::UnavailableError(absl::StrCat(
          command[0], " to ", DescribeClusterUrl(url_), ": ", why));
    }
    if (reply.r->type == REDIS_REPLY_ERROR) {
      const std::string why(reply.r->str, reply.r->len);
      Drop();
      // Redis's own words; never the password.
      return absl::FailedPreconditionError(absl::StrCat(
          DescribeClusterUrl(url_), " refused ", command[0], ": ", why));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PeerFigures>> ClusterExchange::Exchange(
    absl::Span<const KeyFigures> mine, absl::Duration timeout) {
  if (context_ == nullptr) {
    if (absl::Status s = Connect(timeout); !s.ok()) return s;
  } else if (redisSetTimeout(context_, RedisTimeout(timeout)) != REDIS_OK) {
    Drop();
    return absl::UnavailableError("cannot set the Redis socket timeout");
  }
  const std::string prefix = absl::StrCat("trafficrate:", zone_, ":");
  const std::string hosts_key = absl::StrCat(prefix, "hosts");
  auto host_key = [&prefix](absl::string_view id) {
    return absl::StrCat(prefix, "host:", id);
  };
  const std::string own = host_key(host_id_);
  const std::string temporary = absl::StrCat(own, ":new");
  const std::string ttl = absl::StrCat(ttl_ms_ > 0 ? ttl_ms_ : 1);

  // The pipeline: every command as its words.
  std::vector<std::vector<std::string>> commands;
  if (!gone_.empty()) {
    // Hosts whose hash had expired at the last exchange leave the set (at
    // worst another host does it too).
    std::vector<std::string> srem = {"SREM", hosts_key};
    srem.insert(srem.end(), gone_.begin(), gone_.end());
    commands.push_back(std::move(srem));
  }
  // Who wrote this host's hash last: another instance than this one, tick
  // after tick, means another host uses the same id (IdClash).
  const size_t writer_at = commands.size();
  commands.push_back({"HGET", own, kHeartbeatField});
  commands.push_back({"DEL", temporary});
  // The heartbeat field: a live host's hash is never empty, so an empty
  // one means that host's hash expired.
  std::vector<std::string> hset = {"HSET", temporary, kHeartbeatField,
                                   instance_};
  for (const KeyFigures& k : mine) {
    hset.push_back(k.name);
    hset.push_back(absl::StrFormat("%.0f %u", k.demand, k.connections));
  }
  commands.push_back(std::move(hset));
  commands.push_back({"PEXPIRE", temporary, ttl});
  commands.push_back({"RENAME", temporary, own});
  commands.push_back({"SADD", hosts_key, host_id_});
  commands.push_back({"PEXPIRE", hosts_key, "3600000"});
  const size_t members_at = commands.size();
  commands.push_back({"SMEMBERS", hosts_key});
  // Of each other host, only the figures of this host's keys (and its
  // heartbeat): what is read is bounded by what this host has, whatever
  // the others hold.
  std::vector<std::string> asked;
  for (const std::string& h : known_hosts_) {
    if (h == host_id_) continue;
    asked.push_back(h);
    std::vector<std::string> hmget = {"HMGET", host_key(h), kHeartbeatField};
    for (const KeyFigures& k : mine) hmget.push_back(k.name);
    commands.push_back(std::move(hmget));
  }
  for (const std::vector<std::string>& command : commands) {
    Argv a(command);
    if (redisAppendCommandArgv(context_, a.argc(), a.argv.data(),
                               a.lens.data()) != REDIS_OK) {
      Drop();
      return absl::UnavailableError("cannot queue a Redis command");
    }
  }

  std::vector<PeerFigures> peers;
  std::vector<std::string> gone;
  std::vector<std::string> members;
  absl::Status failure;
  for (size_t i = 0; i < commands.size(); ++i) {
    Reply reply;
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      const std::string why = context_->errstr;
      Drop();
      return absl::UnavailableError(
          absl::StrCat("no answer from ", DescribeClusterUrl(url_), ": ", why));
    }
    reply.r = static_cast<redisReply*>(raw);
    const redisReply* r = reply.r;
    if (r->type == REDIS_REPLY_ERROR && i > members_at) {
      // Another host's entry is not a hash of ours (written by something
      // else): that host is skipped, and taken out of the set.
      gone.push_back(asked[i - members_at - 1]);
      continue;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      // Read every reply first, so the connection stays in step.
      if (failure.ok()) {
        failure = absl::FailedPreconditionError(
            absl::StrCat(DescribeClusterUrl(url_), " refused ", commands[i][0],
                         ": ", std::string(r->str, r->len)));
      }
      continue;
    }
    if (i == writer_at) {
      // Absent (the first exchange, or expired) or this instance's: fine.
      const bool other = r->type == REDIS_REPLY_STRING &&
                         absl::string_view(r->str, r->len) != instance_;
      foreign_writes_ = other ? foreign_writes_ + 1 : 0;
    } else if (i == members_at && r->type == REDIS_REPLY_ARRAY) {
      for (size_t m = 0; m < r->elements && m < kMaxHosts; ++m) {
        const redisReply* e = r->element[m];
        if (e->type == REDIS_REPLY_STRING) members.emplace_back(e->str, e->len);
      }
    } else if (i > members_at && r->type == REDIS_REPLY_ARRAY) {
      const std::string& host = asked[i - members_at - 1];
      if (r->elements == 0 || r->element[0]->type != REDIS_REPLY_STRING) {
        gone.push_back(host);  // its hash expired: the host is gone
        continue;
      }
      PeerFigures peer;
      peer.host = host;
      for (size_t f = 1; f < r->elements && f <= mine.size(); ++f) {
        KeyFigures k;
        if (ParseFigures(r->element[f], &k)) {
          k.name = mine[f - 1].name;
          peer.keys.push_back(std::move(k));
        }
      }
      peers.push_back(std::move(peer));
    }
  }
  if (!failure.ok()) {
    Drop();
    return failure;
  }
  known_hosts_ = std::move(members);
  gone_ = std::move(gone);
  ++successes_;
  return peers;
}

}  // namespace trafficrate
