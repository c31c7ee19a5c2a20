#include "src/cluster/cluster_agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "src/base/clock.h"
#include "src/budget/budget.h"
#include "src/shm/key_budget.h"

namespace trafficrate {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
// A key that stopped sending here keeps its share this long (a client that
// reconnects at once), then goes back to the rule's rate.
constexpr int64_t kForgetShareNs = 1'000'000'000;
// Exchanges in a row that find this host's entry written by another
// instance before that is called a clash of host ids (a process of this
// zone that took the exchange over finds its predecessor's once).
constexpr int kClashExchanges = 3;

// A share moved enough to re-pace the key's connections: by 1% (or to or
// from none).
bool ShareMoved(uint64_t before, uint64_t after) {
  if (before == after) return false;
  if (before == 0 || after == 0) return true;
  const uint64_t diff = before > after ? before - after : after - before;
  return diff * 100 >= std::max(before, after);
}

void WriteText(uint8_t* field, const std::string& text) {
  const size_t n = std::min(text.size(), kClusterTextBytes - 1);
  for (size_t i = 0; i < kClusterTextBytes; ++i) {
    __atomic_store_n(&field[i], i < n ? static_cast<uint8_t>(text[i]) : 0,
                     __ATOMIC_RELAXED);
  }
}

}  // namespace

ClusterAgent::ClusterAgent(Zone* zone, const Logger* logger,
                           ClusterAgentOptions options)
    : zone_(zone), logger_(logger), options_(std::move(options)) {}

ClusterAgent::~ClusterAgent() {
  if (running_.load(std::memory_order_acquire)) {
    stop_.store(true, std::memory_order_release);
    pthread_join(thread_, nullptr);
  }
}

void ClusterAgent::Poll(uint32_t proc, int64_t now_ns) {
  if (running_.load(std::memory_order_acquire) || zone_->segment().corrupt())
    return;
  // A thread that ended (lost the lease) has been joined by nobody.
  if (proc_.load(std::memory_order_relaxed) != kNoSlot) {
    pthread_join(thread_, nullptr);
    proc_.store(kNoSlot, std::memory_order_relaxed);
  }
  FreeLeaseOfDeadHolder(proc);
  if (!TryTakeLeaseWord(zone_->settings().cluster().lease, proc, now_ns,
                        options_.lease_ms)) {
    return;
  }
  proc_.store(proc, std::memory_order_relaxed);
  stop_.store(false, std::memory_order_relaxed);
  running_.store(true, std::memory_order_release);
  // Called from the watcher, whose signals are all blocked: so are the
  // new thread's.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kStackBytes);
  const int rc = pthread_create(&thread_, &attr, &Main, this);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    running_.store(false, std::memory_order_release);
    proc_.store(kNoSlot, std::memory_order_relaxed);
    logger_->Warning(
        "cannot start the cluster thread (%s); zone %s's keys keep this "
        "host's full rate until another process takes the cluster over",
        strerror(rc), zone_->name().c_str());
  }
}

void ClusterAgent::FreeLeaseOfDeadHolder(uint32_t proc) {
  // The holder's process died (or left the zone) if its slot's liveness
  // mutex says so. Waiting for its lease to run out (lease_ms) and then for
  // the next poll would leave this host's figures in Redis unrenewed for
  // longer than they live (ttl_ms): the other hosts would count it gone
  // and take its part for a tick or two.
  std::atomic<uint64_t>& lease = zone_->settings().cluster().lease;
  uint64_t seen = lease.load(std::memory_order_acquire);
  const LeaseWord current = LeaseWord::From(seen);
  if (!current.held() || current.holder() == proc ||
      current.holder() >= zone_->procs().capacity() ||
      !ProcTable::MaybeDead(zone_->procs().slot(current.holder()))) {
    return;
  }
  // Lost to a renewal or another taker: the lease is theirs.
  lease.compare_exchange_strong(seen, 0, std::memory_order_acq_rel);
}

void ClusterAgent::AfterForkChild() {
  // The thread, its Redis connection and the lease are the parent's.
  running_.store(false, std::memory_order_relaxed);
  proc_.store(kNoSlot, std::memory_order_relaxed);
  stop_.store(false, std::memory_order_relaxed);
  // The child must not close or reuse the parent's socket (it is the same
  // one): forget the exchange without freeing it.
  if (exchange_ != nullptr) exchange_.release()->ForgetAfterFork();
  last_share_.clear();
  applied_.clear();
  fell_back_ = false;
}

void* ClusterAgent::Main(void* self) {
  pthread_setname_np(pthread_self(), "trafficrate-cl");
  static_cast<ClusterAgent*>(self)->Run();
  return nullptr;
}

void ClusterAgent::Run() {
  const uint32_t proc = proc_.load(std::memory_order_relaxed);
  PublishIdentity();
  int64_t next = MonotonicNowNs();
  while (!stop_.load(std::memory_order_acquire)) {
    const int64_t now = MonotonicNowNs();
    if (now < next) {
      SleepNs(std::min<int64_t>(next - now, options_.tick_ns));
      continue;
    }
    if (!PassForTesting(proc, now)) break;  // another process has it now
    next = now + options_.tick_ns;
  }
  running_.store(false, std::memory_order_release);
}

void ClusterAgent::PublishIdentity() {
  ClusterShm& c = zone_->settings().cluster();
  WriteText(c.url, DescribeClusterUrl(options_.url));
  WriteText(c.name, options_.name);
  WriteText(c.host, options_.host_id);
  c.pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  if (c.state.load(std::memory_order_relaxed) == kClusterOff) {
    c.state.store(kClusterConnecting, std::memory_order_relaxed);
  }
}

bool ClusterAgent::PassForTesting(uint32_t proc, int64_t now_ns) {
  if (!TryTakeLeaseWord(zone_->settings().cluster().lease, proc, now_ns,
                        options_.lease_ms)) {
    return false;
  }
  if (exchange_ == nullptr) {
    exchange_ = std::make_unique<ClusterExchange>(
        options_.url, options_.name, options_.host_id, options_.ttl_ms);
    PublishIdentity();
  }
  if (last_share_.size() != zone_->keys().capacity()) {
    last_share_.assign(zone_->keys().capacity(), 0.0);
    applied_.assign(zone_->keys().capacity(), 0);
  }
  Pass(now_ns);
  zone_->settings().cluster().beat_ns.store(MonotonicNowNs(),
                                            std::memory_order_relaxed);
  return true;
}

void ClusterAgent::Pass(int64_t now_ns) {
  // This host's keys with sending connections.
  std::vector<KeyFigures> mine;
  std::vector<uint32_t> slots;
  const bool budget = zone_->settings().share_mode() == ShareMode::kBudget;
  bool moved = false;
  for (uint32_t k = 0; k < zone_->keys().capacity(); ++k) {
    KeySlotShm& key = zone_->keys().slot(k);
    if (key.in_use.load(std::memory_order_acquire) != 1) {
      if (key.cluster_share.load(std::memory_order_relaxed) != 0) {
        key.cluster_share.store(0, std::memory_order_relaxed);
      }
      last_share_[k] = 0;
      continue;
    }
    const uint32_t active = key.active.load(std::memory_order_relaxed);
    if (active == 0 || active > zone_->conns().capacity()) {
      const int64_t last = key.last_active_ns.load(std::memory_order_relaxed);
      if (key.cluster_share.load(std::memory_order_relaxed) != 0 &&
          ElapsedNs(now_ns, last) > kForgetShareNs) {
        moved |= StoreShare(k, 0);
        key.cluster_active.store(0, std::memory_order_relaxed);
        key.cluster_hosts.store(0, std::memory_order_relaxed);
        last_share_[k] = 0;
      }
      continue;
    }
    KeyFigures f;
    f.name = FleetKeyName(key);
    f.connections = active;
    f.demand = std::numeric_limits<double>::infinity();
    if (budget && key.boost.load(std::memory_order_relaxed) == kBoostUnbound) {
      // Clearly under its rate here: it wants what it sends, with room.
      f.demand = std::max<double>(
          2.0 * key.measured_bytes_per_sec.load(std::memory_order_relaxed),
          kSegmentBytes);
    }
    mine.push_back(std::move(f));
    slots.push_back(k);
  }
  ClusterShm& c = zone_->settings().cluster();
  const int64_t start = MonotonicNowNs();
  absl::StatusOr<std::vector<PeerFigures>> peers =
      exchange_->Exchange(mine, absl::Nanoseconds(options_.timeout_ns));
  if (peers.ok() && exchange_->successes() == 1) {
    // The first exchange only learns which hosts there are: without a
    // second one now, a process that takes the exchange over would give
    // every key the full rate for a tick.
    peers = exchange_->Exchange(mine, absl::Nanoseconds(options_.timeout_ns));
  }
  const int64_t rtt_ns = MonotonicNowNs() - start;
  if (!peers.ok()) {
    Fallback(now_ns, peers.status());
    if (moved) zone_->changes().WakeWatchers();
    return;
  }
  if (fell_back_) {
    logger_->Notice(
        "cluster: Redis at %s answers again after %.1f s; zone %s's shares "
        "are exchanged again",
        DescribeClusterUrl(options_.url).c_str(),
        static_cast<double>(now_ns - fell_back_ns_) / 1e9,
        zone_->name().c_str());
    fell_back_ = false;
  }
  if (exchange_->foreign_writes() == kClashExchanges) {
    logger_->Warning(
        "cluster: another host writes to Redis under this host's id %s, so "
        "each overwrites the other's figures and both take too much; give "
        "each host of the fleet its own TRAFFICRATE_CLUSTER_HOST (the id is "
        "HOST/ZONE, HOST by default the hostname)",
        options_.host_id.c_str());
  }
  last_success_ns_ = now_ns;
  c.state.store(kClusterConnected, std::memory_order_relaxed);
  c.rtt_us.store(
      static_cast<uint32_t>(std::min<int64_t>(rtt_ns / 1000, UINT32_MAX)),
      std::memory_order_relaxed);
  c.peers.store(static_cast<uint32_t>(peers->size()),
                std::memory_order_relaxed);
  c.last_exchange_ns.store(now_ns, std::memory_order_relaxed);
  c.exchanges.fetch_add(1, std::memory_order_relaxed);
  // Every other host's figures for each of this host's keys.
  absl::flat_hash_map<absl::string_view, size_t> index;
  index.reserve(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) index.emplace(mine[i].name, i);
  std::vector<std::vector<HostDemand>> hosts(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    hosts[i].push_back({mine[i].demand, mine[i].connections});
  }
  for (const PeerFigures& peer : *peers) {
    for (const KeyFigures& f : peer.keys) {
      auto it = index.find(f.name);
      if (it == index.end() || f.connections == 0) continue;
      hosts[it->second].push_back({f.demand, f.connections});
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    KeySlotShm& key = zone_->keys().slot(slots[i]);
    const uint64_t rate =
        zone_->settings().RuleRate(zone_->settings().RuleOf(key));
    uint32_t total = 0;
    for (const HostDemand& h : hosts[i]) total += h.connections;
    key.cluster_active.store(total, std::memory_order_relaxed);
    key.cluster_hosts.store(static_cast<uint32_t>(hosts[i].size()),
                            std::memory_order_relaxed);
    if (rate == 0) continue;
    const double share = MaxMinShares(static_cast<double>(rate), hosts[i])[0];
    last_share_[slots[i]] = share;
    moved |= StoreShare(slots[i],
                        std::clamp<uint64_t>(std::llround(share), 1, rate));
  }
  if (moved) zone_->changes().WakeWatchers();
}

std::string ClusterAgent::FleetKeyName(const KeySlotShm& key) const {
  // The key's bytes without its rule's place in this zone (byte 18), which
  // another host may have given the rule, and the rule's name instead: the
  // same client under the same named rule is one key on every host.
  std::string material(kKeyBytes, '\0');
  for (size_t i = 0; i < kKeyBytes; ++i) {
    material[i] =
        static_cast<char>(__atomic_load_n(&key.key[i], __ATOMIC_RELAXED));
  }
  material[kKeyRuleByte] = 0;
  material += zone_->settings().RuleName(zone_->settings().RuleOf(key));
  return ClusterKeyName(options_.name, material.data(), material.size(),
                        options_.secret);
}

void ClusterAgent::Fallback(int64_t now_ns, const absl::Status& why) {
  ClusterShm& c = zone_->settings().cluster();
  c.failures.fetch_add(1, std::memory_order_relaxed);
  if (!fell_back_) {
    fell_back_ = true;
    fell_back_ns_ = now_ns;
    c.fallbacks.fetch_add(1, std::memory_order_relaxed);
    c.state.store(kClusterFallback, std::memory_order_relaxed);
    logger_->Warning(
        "cluster: %s; zone %s falls back: each key's last share moves to "
        "this host's full rate over %.1f s, until Redis answers again",
        std::string(why.message()).c_str(), zone_->name().c_str(),
        static_cast<double>(options_.decay_ns) / 1e9);
  }
  // From the last successful exchange (or from now, if there was none).
  const int64_t since =
      last_success_ns_ != 0 ? now_ns - last_success_ns_ : options_.decay_ns;
  bool moved = false;
  for (uint32_t k = 0; k < zone_->keys().capacity(); ++k) {
    KeySlotShm& key = zone_->keys().slot(k);
    if (last_share_[k] == 0 ||
        key.in_use.load(std::memory_order_relaxed) != 1) {
      continue;
    }
    const uint64_t rate =
        zone_->settings().RuleRate(zone_->settings().RuleOf(key));
    if (rate == 0) continue;
    const double share = FallbackShare(
        last_share_[k], static_cast<double>(rate), since, options_.decay_ns);
    if (share >= static_cast<double>(rate)) {
      last_share_[k] = 0;
      moved |= StoreShare(k, 0);
      continue;
    }
    moved |= StoreShare(k, std::clamp<uint64_t>(std::llround(share), 1, rate));
  }
  if (moved) zone_->changes().WakeWatchers();
}

bool ClusterAgent::StoreShare(uint32_t k, uint64_t share) {
  KeySlotShm& key = zone_->keys().slot(k);
  key.cluster_share.store(share, std::memory_order_relaxed);
  if (!ShareMoved(applied_[k], share)) return false;
  applied_[k] = share;
  // Every watcher re-applies the key's shares on its next scan; a budget
  // controller reads the new rate on its next tick.
  key.generation.fetch_add(1, std::memory_order_release);
  return true;
}

}  // namespace trafficrate
