// The zone's change word (ZoneHeaderShm::change_word): a futex every process
// of the zone shares. Whoever changes something that every watcher must act
// on (a key's membership, a setting, a repair) bumps it and wakes the
// watchers blocked on it; a watcher reads it, does its pass, and then waits
// until it moves.
//
//   const uint32_t seen = changes.Current();
//   ... re-apply every share ...
//   changes.WaitForChange(seen, kTickNs);
//
// Thread and process safety: safe from any thread of any process, without
// the zone lock (and never called under it: WakeWatchers and WaitForChange
// may make a futex system call, which may set errno; the interposers save
// errno around everything they call). No allocation.

#ifndef TRAFFICRATE_SRC_SHM_CHANGE_WORD_H_
#define TRAFFICRATE_SRC_SHM_CHANGE_WORD_H_

#include <cstdint>

#include "src/shm/zone_layout.h"

namespace trafficrate {

class ChangeWord {
 public:
  // `header` must outlive the ChangeWord.
  explicit ChangeWord(ZoneHeaderShm& header) : header_(&header) {}

  // The word now (an acquire load).
  uint32_t Current() const;
  // Bumps the word, and wakes every waiter if any is waiting (a futex wake
  // only then: a bump nobody waits for costs no system call).
  void WakeWatchers();
  // Returns when the word differs from `seen`, on a wake, or after
  // timeout_ns (spurious returns possible); at once if timeout_ns <= 0.
  void WaitForChange(uint32_t seen, int64_t timeout_ns);

 private:
  ZoneHeaderShm* header_;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_CHANGE_WORD_H_
