#include "src/runtime/local_conns.h"

#include "src/base/private_array.h"

namespace trafficrate {

LocalConns::LocalConns(uint32_t capacity)
    : capacity_(capacity), conns_(MapPrivateArray<LocalConn>(capacity)) {}

LocalConns::~LocalConns() { UnmapPrivateArray(conns_, capacity_); }

void LocalConns::AddRef(uint32_t index, uint32_t cookie) const {
  std::atomic<uint64_t>& refs = conns_[index].refs;
  uint64_t seen = refs.load(std::memory_order_relaxed);
  while (!refs.compare_exchange_weak(seen,
                                     LocalRefs::From(seen).Added(cookie).word(),
                                     std::memory_order_acq_rel)) {
  }
}

bool LocalConns::DropRef(uint32_t index, uint32_t cookie) const {
  std::atomic<uint64_t>& refs = conns_[index].refs;
  uint64_t seen = refs.load(std::memory_order_relaxed);
  LocalRefs held;
  do {
    held = LocalRefs::From(seen);
    // Another cookie: this fd held a registration that ended already.
    if (!held.Holds(cookie)) return false;
  } while (!refs.compare_exchange_weak(seen, held.Dropped().word(),
                                       std::memory_order_acq_rel));
  return held.count() == 1;
}

uint32_t LocalConns::Refs(uint32_t index, uint32_t cookie) const {
  const LocalRefs refs =
      LocalRefs::From(conns_[index].refs.load(std::memory_order_relaxed));
  return refs.cookie() == cookie ? refs.count() : 0;
}

void LocalConns::Reset(uint32_t index, int64_t now_ns,
                       uint32_t first_pieces) const {
  LocalConn& local = conns_[index];
  local.last_send_ns.store(now_ns, std::memory_order_relaxed);
  local.next_measure_ns.store(0, std::memory_order_relaxed);
  local.meter.Reset();
  local.next_idle_check_ns.store(0, std::memory_order_relaxed);
  local.idle_queued.store(0, std::memory_order_relaxed);
  local.idle_queued_ns.store(0, std::memory_order_relaxed);
  local.applied_ns.store(0, std::memory_order_relaxed);
  local.kernel_base.store(kNoKernelBase, std::memory_order_relaxed);
  StartRest(index);
  local.piece.store(0, std::memory_order_relaxed);
  local.mss.store(0, std::memory_order_relaxed);
  local.first_left.store(first_pieces, std::memory_order_relaxed);
}

void LocalConns::StartRest(uint32_t index) const {
  LocalConn& local = conns_[index];
  local.rest_written.store(kNoKernelBase, std::memory_order_relaxed);
  local.rest_look_ns.store(0, std::memory_order_relaxed);
  local.rest_gap_ns.store(0, std::memory_order_relaxed);
}

}  // namespace trafficrate
