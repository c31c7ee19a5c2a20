#include "src/base/process_token.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

namespace trafficrate {

#ifndef MADV_WIPEONFORK
#define MADV_WIPEONFORK 18
#endif

ProcessToken::ProcessToken() {
  const long page = sysconf(_SC_PAGESIZE);
  const size_t size = page > 0 ? static_cast<size_t>(page) : 4096;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  if (madvise(p, size, MADV_WIPEONFORK) != 0) {
    munmap(p, size);
    return;
  }
  word_ = new (p) std::atomic<uint32_t>(kArmed);
}

ProcessToken::~ProcessToken() {
  if (word_ == nullptr) return;
  const long page = sysconf(_SC_PAGESIZE);
  munmap(word_, page > 0 ? static_cast<size_t>(page) : 4096);
}

bool ProcessToken::BeginRenew() {
  if (word_ == nullptr) return false;
  uint32_t wiped = kWiped;
  return word_->compare_exchange_strong(wiped, kRenewing,
                                        std::memory_order_acq_rel);
}

void ProcessToken::Arm() {
  if (word_ != nullptr) word_->store(kArmed, std::memory_order_release);
}

}  // namespace trafficrate
