// Pacing and shaping: the rate a sending connection of a key gets (an equal
// share, or the key's budget level), and applying it to a socket with
// SO_MAX_PACING_RATE together with the packet shaper's piece size
// (shaper.h) and the first pieces the path makes worth it.
//
//   Pacer pacer(context);
//   pacer.ApplyIfChanged(fd, entry, state, conn);  // after a join, a tick
//
// Thread safety: any thread; ApplyIfChanged pins the fd's entry (fd_table.h)
// so that a close cannot slip between its check and its setsockopt.

#ifndef TRAFFICRATE_SRC_RUNTIME_PACER_H_
#define TRAFFICRATE_SRC_RUNTIME_PACER_H_

#include <cstdint>

#include "src/runtime/governor_context.h"

namespace trafficrate {

class Pacer : private GovernorPart {
 public:
  explicit Pacer(const GovernorContext& context) : GovernorPart(context) {}

  // What a share was computed from: the zone's settings generation and the
  // key's (joins, leaves, decided levels). An fd's entry holds the token of
  // the share last applied to it (FdEntry::applied).
  uint64_t ShareToken(const KeySlotShm& key) const;
  // The pacing rate for a sending connection of `key`: rate/active in equal
  // mode, the key's level in budget mode. kUnpaced (and the zone marked
  // corrupt) for figures no process writes.
  uint64_t ShareFor(const KeySlotShm& key) const;
  // Sets the socket's pacing to its key's share if that changed since it
  // was last applied to this fd; true if it did.
  bool ApplyIfChanged(int fd, FdEntry& entry, uint64_t state,
                      const ConnSlotShm& conn) const;
  // SO_MAX_PACING_RATE of fd to `rate`, noted as conn's pacing in the
  // zone, with the shaper's piece for it; false (nothing noted) if the
  // kernel refused it.
  bool SetPacing(int fd, const ConnSlotShm& conn, uint64_t rate) const;
  // The watcher, after a join or leave anywhere in the zone: re-applies
  // the changed shares of this process's sending connections (in budget
  // mode only where the share moved off the paced level).
  void ApplyChanged() const;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_RUNTIME_PACER_H_
