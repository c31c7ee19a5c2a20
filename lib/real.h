// The real libc functions behind the interposers, resolved once with
// dlsym(RTLD_NEXT, ...) in the library's constructor.
//
// Before that (another library's constructor calling write) or if a symbol
// cannot be resolved, the interposers fall back to the raw system call, so a
// call is never failed because of us.

#ifndef TRAFFICRATE_LIB_REAL_H_
#define TRAFFICRATE_LIB_REAL_H_

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

namespace trafficrate {

struct RealFunctions {
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*listen)(int, int);
  int (*close)(int);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*close_range)(unsigned int, unsigned int, int);
  void (*closefrom)(int);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  int (*fcntl)(int, int, ...);
  int (*fcntl64)(int, int, ...);
  ssize_t (*write)(int, const void*, size_t);
  ssize_t (*writev)(int, const iovec*, int);
  ssize_t (*send)(int, const void*, size_t, int);
  ssize_t (*sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  int (*sendmmsg)(int, mmsghdr*, unsigned int, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
  ssize_t (*sendfile64)(int, int, off64_t*, size_t);
  ssize_t (*splice)(int, loff_t*, int, loff_t*, size_t, unsigned int);
  ssize_t (*recvmsg)(int, msghdr*, int);
  int (*recvmmsg)(int, mmsghdr*, unsigned int, int, timespec*);
  int (*setrlimit)(__rlimit_resource_t, const rlimit*);
  int (*setrlimit64)(__rlimit_resource_t, const rlimit64*);
  int (*prlimit)(pid_t, __rlimit_resource, const rlimit*, rlimit*);
  int (*prlimit64)(pid_t, __rlimit_resource, const rlimit64*, rlimit64*);
};

// Constant-initialized to null; filled by ResolveRealFunctions().
extern RealFunctions g_real;

// Resolves every entry. Returns the number of symbols that could not be
// resolved (or resolved to our own interposer); those stay null.
int ResolveRealFunctions();

}  // namespace trafficrate

#endif  // TRAFFICRATE_LIB_REAL_H_
