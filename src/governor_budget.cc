// The Governor's shared-budget duties (budget.h): what the watcher does on
// each tick in budget mode, and the drain of connections closed with data
// still unsent. The rest of the Governor is in governor.cc.

#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>

#include <algorithm>

#include "src/budget.h"
#include "src/clock.h"
#include "src/governor.h"
#include "src/key_budget.h"
#include "src/share.h"

namespace trafficrate {
namespace {

// A connection is measured about every two packets at its pacing rate, and
// at least every half second: a syscall per connection per tick would cost
// more than the whole budget allows at 10 000 connections.
constexpr int64_t kMaxMeasureGapNs = 500 * kNsPerMs;
constexpr uint64_t kTwoPacketsBytes = 2 * kSegmentBytes;
// The largest packet the kernel builds (GSO), the most one step counts as.
constexpr uint64_t kMaxPacketBytes = 65536;
// A key is decided at least this often.
constexpr int64_t kMaxDecideGapNs = 200 * kNsPerMs;
// A closed connection is kept at most this long, whatever its rate.
constexpr int64_t kMaxDrainNs = 30 * kNsPerSec;

int64_t MeasureGapNs(uint64_t pacing_bytes_per_sec) {
  if (pacing_bytes_per_sec == 0) return kBudgetTickNs;
  const uint64_t gap = kTwoPacketsBytes * kNsPerSec / pacing_bytes_per_sec;
  return std::clamp<int64_t>(static_cast<int64_t>(gap), kBudgetTickNs,
                             kMaxMeasureGapNs);
}

// Of `handed` bytes, how many have left the socket with `unsent` queued.
uint64_t LeftOf(uint64_t handed, int64_t unsent) {
  return handed > static_cast<uint64_t>(unsent) ? handed - unsent : 0;
}

// Adds what left conn's socket since it was last counted to its key.
void Account(Zone& zone, ConnSlotShm& conn, uint64_t left) {
  const uint64_t before = conn.bytes_left.load(std::memory_order_relaxed);
  if (left <= before) return;
  conn.bytes_left.store(left, std::memory_order_relaxed);
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone.key_capacity()) return;
  zone.key(k).sent_bytes.fetch_add(left - before, std::memory_order_relaxed);
}

// Bytes of fd's connection not yet sent, or -1 if unknown.
int64_t Unsent(int fd) {
  int unsent = 0;
  if (ioctl(fd, SIOCOUTQNSD, &unsent) != 0 || unsent < 0) return -1;
  return unsent;
}

// Whether the client has not closed its end: only then will the kernel
// really send what is queued. A download client that hung up (the server's
// close follows its FIN or RST) gets none of it.
bool PeerStillReading(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  return info.tcpi_state == TCP_ESTABLISHED;
}

}  // namespace

bool Governor::BudgetWanted() const {
  return zone_->share_mode() == ShareMode::kBudget;
}

uint64_t Governor::ShareFor(const KeySlotShm& key) const {
  const uint64_t rate =
      zone_->header().rate_bytes_per_sec.load(std::memory_order_relaxed);
  const uint32_t active = key.active.load(std::memory_order_acquire);
  if (zone_->share_mode() == ShareMode::kEqual) {
    return ShareBytesPerSec(rate, active);
  }
  return LevelInForce(key.level_bytes_per_sec.load(std::memory_order_relaxed),
                      rate, active);
}

void Governor::TickBudget(int64_t now_ns) {
  if (local_ == nullptr || key_local_ == nullptr) return;
  const uint32_t me = watcher_.proc_index();
  ++tick_;
  if (tick_ == 0) tick_ = 1;  // 0 means "never" in key_local_
  const int high_water = table_->high_water();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (state == 0 || StateConn(state) >= zone_->conn_capacity()) continue;
    ConnSlotShm& conn = zone_->conn(StateConn(state));
    if (!ConnValid(conn, state) ||
        !conn.active.load(std::memory_order_relaxed) ||
        conn.proc_index.load(std::memory_order_relaxed) != me) {
      continue;
    }
    MeasureConn(fd, entry, state, conn, now_ns);
    NoteAndDecide(
        conn,
        local_[StateConn(state)].packet_bytes.load(std::memory_order_relaxed),
        now_ns);
    ApplyIfChanged(fd, entry, state, conn);
  }
  TickDrains(now_ns);
}

void Governor::MeasureConn(int fd, FdEntry& entry, uint64_t state,
                           ConnSlotShm& conn, int64_t now_ns) {
  LocalConn& local = local_[StateConn(state)];
  if (now_ns < local.next_measure_ns.load(std::memory_order_relaxed)) {
    EstimateConn(local, conn, now_ns);
    return;
  }
  // Handed first, then the queue: a send in between makes this an
  // underestimate, which the next measurement corrects.
  const uint64_t handed = conn.bytes_sent.load(std::memory_order_relaxed);
  if (!FdTable::TryPin(entry, state, /*wait=*/false)) return;
  const int64_t unsent = Unsent(fd);
  FdTable::Unpin(entry);
  if (unsent < 0) return;
  const uint64_t left = LeftOf(handed, unsent);
  const int64_t prev_ns = local.measured_ns.load(std::memory_order_relaxed);
  const uint64_t prev_left =
      local.measured_left.load(std::memory_order_relaxed);
  uint64_t rate = 0;
  if (prev_ns != 0 && left >= prev_left) {
    const uint64_t step = left - prev_left;
    if (now_ns > prev_ns) {
      const uint64_t inst = static_cast<uint64_t>(
          static_cast<double>(step) * kNsPerSec / (now_ns - prev_ns));
      const uint64_t before = local.left_rate.load(std::memory_order_relaxed);
      rate = before == 0 ? inst : (before + inst) / 2;
    }
    if (step > 0) {
      // Bytes leave in whole packets (TSO: up to 64 KiB on fast paths), and
      // a connection is measured about every two segments at its pace:
      // what left between two measurements of a slow connection is a
      // packet.
      const uint32_t before =
          local.packet_bytes.load(std::memory_order_relaxed);
      local.packet_bytes.store(
          std::max(static_cast<uint32_t>(std::min(step, kMaxPacketBytes)),
                   before - before / 4),
          std::memory_order_relaxed);
    }
  }
  local.measured_left.store(left, std::memory_order_relaxed);
  local.measured_ns.store(now_ns, std::memory_order_relaxed);
  local.left_rate.store(rate, std::memory_order_relaxed);
  if (options_.after_bytes > 0 &&
      conn.bytes_left.load(std::memory_order_relaxed) == 0) {
    // TRAFFICRATE_AFTER: what a connection sent before it joined is free.
    conn.bytes_left.store(left, std::memory_order_relaxed);
  } else {
    Account(*zone_, conn, left);
  }
  local.next_measure_ns.store(
      now_ns + MeasureGapNs(
                   conn.share_bytes_per_sec.load(std::memory_order_relaxed)),
      std::memory_order_relaxed);
}

void Governor::EstimateConn(const LocalConn& local, ConnSlotShm& conn,
                            int64_t now_ns) {
  const int64_t since = local.measured_ns.load(std::memory_order_relaxed);
  // At most its pace: bytes leave in packets, so what was seen between two
  // measurements may be a packet sent at once, and extrapolating that would
  // count ahead of what really left.
  uint64_t rate = local.left_rate.load(std::memory_order_relaxed);
  const uint64_t pace =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  if (pace > 0) rate = std::min(rate, pace);
  if (since == 0 || rate == 0 || now_ns <= since ||
      conn.bytes_left.load(std::memory_order_relaxed) == 0) {
    return;
  }
  // What left since the last measurement, at the rate it was leaving; at
  // most what was handed to the kernel. An estimate too high holds the
  // count until the real bytes catch up (Account only adds).
  const uint64_t estimate =
      local.measured_left.load(std::memory_order_relaxed) +
      static_cast<uint64_t>(static_cast<double>(rate) * (now_ns - since) /
                            kNsPerSec);
  // Less than a segment more: not worth a write to the key's shared line.
  if (estimate <
      conn.bytes_left.load(std::memory_order_relaxed) + kSegmentBytes) {
    return;
  }
  Account(*zone_, conn,
          std::min(estimate, conn.bytes_sent.load(std::memory_order_relaxed)));
}

void Governor::NoteAndDecide(const ConnSlotShm& conn, uint32_t packet_bytes,
                             int64_t now_ns) {
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone_->key_capacity()) return;
  LocalKey& local = key_local_[k];
  if (local.tick == tick_) {
    local.packet_bytes = std::max(local.packet_bytes, packet_bytes);
    return;
  }
  // The first of the key's connections in this tick: the largest packet of
  // the last tick (or of this connection) is what the decision uses.
  local.tick = tick_;
  const uint32_t largest = std::max(local.packet_bytes, packet_bytes);
  local.packet_bytes = packet_bytes;
  DecideKey(k, largest, now_ns);
}

void Governor::DecideKey(uint32_t key_index, uint32_t packet_bytes,
                         int64_t now_ns) {
  if (key_index >= zone_->key_capacity()) return;
  KeySlotShm& key = zone_->key(key_index);
  // A key whose connections send packets far apart is decided less often:
  // a new level reaches them only at their next packet anyway.
  const int64_t last = key.budget_last_ns.load(std::memory_order_relaxed);
  const uint64_t level =
      key.level_bytes_per_sec.load(std::memory_order_relaxed);
  int64_t every = kBudgetTickNs / 2;
  if (level > 0 && packet_bytes > 0) {
    every = std::clamp<int64_t>(
        static_cast<int64_t>(PacketGapNs(packet_bytes, level) / 4),
        kBudgetTickNs / 2, kMaxDecideGapNs);
  }
  if (last != 0 && now_ns - last < every) return;
  if (!TryTakeLease(key, watcher_.proc_index(), now_ns)) return;
  BudgetState state = LoadBudget(key);
  if (state.last_ns != last) return;  // decided a moment ago elsewhere
  const uint64_t published = state.level_bytes_per_sec;
  state = BudgetTick(state,
                     {now_ns, key.sent_bytes.load(std::memory_order_relaxed),
                      key.active.load(std::memory_order_relaxed), packet_bytes},
                     zone_->budget_settings());
  const bool changed = LevelWorthApplying(published, state.level_bytes_per_sec);
  if (!changed) state.level_bytes_per_sec = published;
  StoreBudget(key, state);
  // Every watcher re-applies on its next tick; senders on their next send.
  if (changed) key.generation.fetch_add(1, std::memory_order_release);
}

bool Governor::KeepDraining(int fd, uint64_t state) {
  const uint32_t index = StateConn(state);
  if (local_ == nullptr || index >= zone_->conn_capacity()) return false;
  ConnSlotShm& conn = zone_->conn(index);
  if (!ConnValid(conn, state) || !conn.active.load(std::memory_order_relaxed) ||
      conn.proc_index.load(std::memory_order_relaxed) !=
          watcher_.proc_index() ||
      (local_[index].refs.load(std::memory_order_relaxed) & 0xffffffffu) != 1) {
    return false;
  }
  const int64_t unsent = Unsent(fd);
  if (unsent <= 0 || !PeerStillReading(fd)) return false;
  const uint64_t packed = uint64_t{index} << 32 | StateCookie(state);
  int slot = 0;
  for (; slot < kDrainSlots; ++slot) {
    uint64_t empty = 0;
    if (drains_[slot].compare_exchange_strong(empty, packed,
                                              std::memory_order_acq_rel)) {
      break;
    }
  }
  if (slot == kDrainSlots) return false;  // full: counted as sent at once
  if (!DropLocalRef(index, StateCookie(state))) {
    // Another fd of this process still has it (a dup raced the close).
    drains_[slot].store(0, std::memory_order_release);
    return true;
  }
  Account(*zone_, conn,
          LeftOf(conn.bytes_sent.load(std::memory_order_relaxed), unsent));
  conn.drain_bytes.store(static_cast<uint64_t>(unsent),
                         std::memory_order_relaxed);
  // While draining, next_measure_ns holds when the drain began.
  const int64_t now = MonotonicNowNs();
  local_[index].drain_last_ns.store(now, std::memory_order_relaxed);
  local_[index].next_measure_ns.store(now, std::memory_order_relaxed);
  return true;
}

void Governor::TickDrains(int64_t now_ns) {
  const uint32_t me = watcher_.proc_index();
  for (int slot = 0; slot < kDrainSlots; ++slot) {
    const uint64_t packed = drains_[slot].load(std::memory_order_acquire);
    if (packed == 0) continue;
    const uint32_t index = static_cast<uint32_t>(packed >> 32);
    const uint64_t state = PackState(index, static_cast<uint32_t>(packed));
    if (index >= zone_->conn_capacity()) {
      drains_[slot].store(0, std::memory_order_release);
      continue;
    }
    ConnSlotShm& conn = zone_->conn(index);
    if (!ConnValid(conn, state) ||
        conn.proc_index.load(std::memory_order_relaxed) != me) {
      drains_[slot].store(0, std::memory_order_release);  // reaped meanwhile
      continue;
    }
    // The kernel sends what is left at the pacing rate in force at close:
    // nobody can change an orphaned socket's rate.
    LocalConn& local = local_[index];
    uint64_t remaining = conn.drain_bytes.load(std::memory_order_relaxed);
    uint64_t pace = conn.share_bytes_per_sec.load(std::memory_order_relaxed);
    if (pace == 0) {
      pace = zone_->header().rate_bytes_per_sec.load(std::memory_order_relaxed);
    }
    const int64_t dt =
        now_ns - local.drain_last_ns.load(std::memory_order_relaxed);
    const uint64_t drained =
        dt <= 0
            ? 0
            : static_cast<uint64_t>(static_cast<double>(pace) * dt / kNsPerSec);
    const bool done =
        drained >= remaining ||
        now_ns - local.next_measure_ns.load(std::memory_order_relaxed) >
            kMaxDrainNs;
    const uint64_t step = done ? remaining : drained;
    if (step > 0) {
      Account(*zone_, conn,
              conn.bytes_left.load(std::memory_order_relaxed) + step);
      local.drain_last_ns.store(now_ns, std::memory_order_relaxed);
    }
    remaining -= step;
    conn.drain_bytes.store(remaining, std::memory_order_relaxed);
    NoteAndDecide(conn, local.packet_bytes.load(std::memory_order_relaxed),
                  now_ns);
    if (!done) continue;
    bool push = false;
    {
      ZoneLock lock(*zone_);
      if (!lock.ok()) continue;  // try again next tick
      if (ConnValid(conn, state) &&
          conn.proc_index.load(std::memory_order_relaxed) == me) {
        const uint32_t key = conn.key_index.load(std::memory_order_relaxed);
        push = zone_->DeregisterConnLocked(index) &&
               key < zone_->key_capacity() &&
               zone_->key(key).active.load(std::memory_order_relaxed) > 0;
      }
    }
    drains_[slot].store(0, std::memory_order_release);
    if (push) zone_->WakeWatchers();
  }
}

}  // namespace trafficrate
