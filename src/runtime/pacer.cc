#include "src/runtime/pacer.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "src/budget/budget.h"
#include "src/budget/shaper.h"
#include "src/budget/share.h"
#include "src/shm/key_budget.h"

namespace trafficrate {

uint64_t Pacer::ShareToken(const KeySlotShm& key) const {
  // The settings generation first, as the writers bump it last.
  const uint32_t settings = static_cast<uint32_t>(
      zone_->header().settings_generation.load(std::memory_order_acquire));
  return ShareGenerations::Of(settings,
                              key.generation.load(std::memory_order_acquire))
      .word();
}

uint64_t Pacer::ShareFor(const KeySlotShm& key) const {
  const uint64_t rate = zone_->settings().KeyRate(key);
  const uint32_t active = key.active.load(std::memory_order_acquire);
  if (rate == 0 || active > zone_->conns().capacity()) {
    // Figures no process writes: a share from them could pace the key's
    // connections down to nothing. The zone is corrupt; unpaced meanwhile.
    zone_->segment().MarkCorrupt(
        rate == 0 ? "its rate is 0" : "a key counts more connections than fit");
    return kUnpaced;
  }
  if (zone_->settings().share_mode() == ShareMode::kEqual) {
    return ShareBytesPerSec(rate, active);
  }
  return LevelInForce(key.level_bytes_per_sec.load(std::memory_order_relaxed),
                      rate, active);
}

bool Pacer::ApplyIfChanged(int fd, FdEntry& entry, uint64_t state,
                           const ConnSlotShm& conn) const {
  const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
  if (k >= zone_->keys().capacity()) return false;
  const KeySlotShm& key = zone_->keys().slot(k);
  if (ShareToken(key) == entry.applied.load(std::memory_order_relaxed)) {
    return false;
  }
  // Pinned, so that a close cannot slip between our check and setsockopt,
  // and so that two threads never apply out of order.
  if (!FdTable::TryPin(entry, state, /*wait=*/true)) return false;
  const uint64_t token = ShareToken(key);
  const uint64_t before =
      conn.share_bytes_per_sec.load(std::memory_order_relaxed);
  const uint64_t share = ShareFor(key);
  // A raise drains its queue sooner: the idle pass looks at it again now.
  if (SetPacing(fd, conn, share) && share > before) {
    entry.visit_tick.store(0, std::memory_order_relaxed);
  }
  entry.applied.store(token, std::memory_order_relaxed);
  FdTable::Unpin(entry);
  return true;
}

bool Pacer::SetPacing(int fd, const ConnSlotShm& conn, uint64_t rate) const {
  if (setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) !=
      0) {
    return false;
  }
  if (options_.shape) {
    const uint32_t index = zone_->conns().IndexOf(conn);
    LocalConn& local = local_[index];
    if (local.mss.load(std::memory_order_relaxed) == 0) {
      // Once per connection (its first pacing, before its first byte): the
      // kernel's MSS on its path, and its round trip as the handshake
      // measured it, which decide whether first pieces are worth a round
      // trip (FirstPiecesPay).
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
          info.tcpi_snd_mss > 0) {
        local.mss.store(info.tcpi_snd_mss, std::memory_order_relaxed);
        if (!FirstPiecesPay(rate, info.tcpi_snd_mss, info.tcpi_rtt)) {
          local.first_left.store(0, std::memory_order_relaxed);
        }
      }
    }
    const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
    const uint64_t key_rate =
        k < zone_->keys().capacity()
            ? zone_->settings().KeyRate(zone_->keys().slot(k))
            : 0;
    local.piece.store(PieceBytes(rate, VaryIndex(index), key_rate),
                      std::memory_order_relaxed);
  }
  const_cast<ConnSlotShm&>(conn).share_bytes_per_sec.store(
      rate, std::memory_order_relaxed);
  return true;
}

void Pacer::ApplyChanged() const {
  const uint32_t me = watcher_.proc_index();
  const int high_water = table_->high_water();
  const bool budget = BudgetWanted();
  for (int fd = 0; fd < high_water; ++fd) {
    FdEntry& entry = *table_->Get(fd);
    const uint64_t state = entry.state.load(std::memory_order_acquire);
    if (!IsConnState(state)) continue;
    const ConnSlotShm& conn = zone_->conns().slot(FdState::From(state).conn());
    if (!ConnValid(conn, state) ||
        !conn.active.load(std::memory_order_relaxed) ||
        conn.proc_index.load(std::memory_order_relaxed) != me) {
      continue;
    }
    // Budget mode: a join or leave moves a decided level not at all (it is
    // per connection) and an equal share among many by a sliver, while each
    // decision that moves the level by 4% makes every connection's token
    // stale; the tick applies steps within a sixteenth once per packet gap
    // (ApplyDue). Applied here, every join re-paced all of this process's
    // connections: at 5 000 connections per key, setsockopt was two thirds
    // of what the watchers spent.
    const uint32_t k = conn.key_index.load(std::memory_order_relaxed);
    if (budget && k < zone_->keys().capacity() &&
        PaceNearLevel(conn.share_bytes_per_sec.load(std::memory_order_relaxed),
                      ShareFor(zone_->keys().slot(k)))) {
      continue;
    }
    ApplyIfChanged(fd, entry, state, conn);
  }
}

}  // namespace trafficrate
