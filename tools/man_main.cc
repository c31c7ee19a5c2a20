// trafficrate_man SECTION DATE: prints the man page trafficrate(SECTION)
// (1 or 7) in roff, from the tables of tools/manual.cc. The build runs it.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/manual.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fputs("usage: trafficrate_man 1|7 YYYY-MM-DD\n", stderr);
    return 2;
  }
  const std::string page = trafficrate::ManPage(std::atoi(argv[1]), argv[2]);
  if (page.empty()) {
    std::fprintf(stderr, "trafficrate_man: no section %s (1 or 7)\n", argv[1]);
    return 2;
  }
  std::fputs(page.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
