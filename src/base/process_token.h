// Tells a new process from the one that made it without a system call.
//
// pthread_atfork handlers run only in children made with fork(); a child
// made with a raw clone system call (vsftpd's sessions) skips them, and
// glibc does not cache getpid(). So the token is a word on a private page
// marked MADV_WIPEONFORK: the kernel hands any child made without CLONE_VM
// (fork, vfork-less clone, however it was called) a zero-filled copy of it.
// A load that reads zero means "this is a new process that nobody has set
// up yet".
//
//   ProcessToken token;                      // armed
//   if (!token.Current() && token.BeginRenew()) {
//     ... reset the process-local state ...  // once, by one thread
//     token.Arm();
//   }
//
// A child made with CLONE_VM (vfork, posix_spawn) shares the page and the
// token reads armed there: such a child must not touch the state it shares
// with its parent, which a pid comparison tells (Governor::SharedWithParent).
//
// Without MADV_WIPEONFORK (Linux before 4.14) the token always reads armed,
// and only pthread_atfork notices new processes. Thread safety: every
// function may be called from any thread.

#ifndef TRAFFICRATE_SRC_BASE_PROCESS_TOKEN_H_
#define TRAFFICRATE_SRC_BASE_PROCESS_TOKEN_H_

#include <atomic>
#include <cstdint>

namespace trafficrate {

class ProcessToken {
 public:
  // Maps the page and arms the token.
  ProcessToken();
  ~ProcessToken();
  ProcessToken(const ProcessToken&) = delete;
  ProcessToken& operator=(const ProcessToken&) = delete;

  // Whether the kernel wipes the token in new processes.
  bool supported() const { return word_ != nullptr; }
  // Hot path: one load, no system call. False in a new process until it is
  // armed again.
  bool Current() const {
    return word_ == nullptr || word_->load(std::memory_order_acquire) == kArmed;
  }
  // In a new process: true for the one caller that must set it up (then
  // Arm), false for every other (another thread is at it, or it is done:
  // see Current).
  bool BeginRenew();
  // The process is set up: Current() is true from now on (in a process made
  // by fork, the pthread_atfork child handler arms it too).
  void Arm();

 private:
  static constexpr uint32_t kWiped = 0;  // what a new process reads
  static constexpr uint32_t kArmed = 1;
  static constexpr uint32_t kRenewing = 2;
  std::atomic<uint32_t>* word_ = nullptr;
};

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_BASE_PROCESS_TOKEN_H_
