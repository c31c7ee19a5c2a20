#include "lib/real.h"

#include <dlfcn.h>

#include "absl/base/attributes.h"

namespace trafficrate {

ABSL_CONST_INIT RealFunctions g_real = {};

namespace {

// dlsym(RTLD_NEXT) finds the next definition after this library. A result
// that is our own symbol (a broken link order) would recurse forever: refuse
// it and fall back to the system call.
template <typename Fn>
bool Resolve(const char* name, Fn* out) {
  void* next = dlsym(RTLD_NEXT, name);
  Dl_info next_info{}, self_info{};
  if (next != nullptr && dladdr(next, &next_info) != 0 &&
      dladdr(reinterpret_cast<void*>(&ResolveRealFunctions), &self_info) != 0 &&
      next_info.dli_fbase == self_info.dli_fbase) {
    next = nullptr;
  }
  *out = reinterpret_cast<Fn>(next);
  return next != nullptr;
}

}  // namespace

int ResolveRealFunctions() {
  RealFunctions r = {};
  int missing = 0;
  missing += !Resolve("accept", &r.accept);
  missing += !Resolve("accept4", &r.accept4);
  missing += !Resolve("listen", &r.listen);
  missing += !Resolve("close", &r.close);
  missing += !Resolve("epoll_create", &r.epoll_create);
  missing += !Resolve("epoll_create1", &r.epoll_create1);
  missing += !Resolve("close_range", &r.close_range);
  missing += !Resolve("closefrom", &r.closefrom);
  missing += !Resolve("dup", &r.dup);
  missing += !Resolve("dup2", &r.dup2);
  missing += !Resolve("dup3", &r.dup3);
  missing += !Resolve("fcntl", &r.fcntl);
  missing += !Resolve("fcntl64", &r.fcntl64);
  missing += !Resolve("write", &r.write);
  missing += !Resolve("writev", &r.writev);
  missing += !Resolve("send", &r.send);
  missing += !Resolve("sendto", &r.sendto);
  missing += !Resolve("sendmsg", &r.sendmsg);
  missing += !Resolve("sendmmsg", &r.sendmmsg);
  missing += !Resolve("sendfile", &r.sendfile);
  missing += !Resolve("sendfile64", &r.sendfile64);
  missing += !Resolve("splice", &r.splice);
  missing += !Resolve("recvmsg", &r.recvmsg);
  missing += !Resolve("recvmmsg", &r.recvmmsg);
  missing += !Resolve("setrlimit", &r.setrlimit);
  missing += !Resolve("setrlimit64", &r.setrlimit64);
  missing += !Resolve("prlimit", &r.prlimit);
  missing += !Resolve("prlimit64", &r.prlimit64);
  g_real = r;
  return missing;
}

}  // namespace trafficrate
