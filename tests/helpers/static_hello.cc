// Test helper, linked statically (-static) by the compiler alone: a program
// the dynamic loader never runs for, so LD_PRELOAD loads nothing into it
// (tests/base/elf_probe_test.cc, tests/integration/test_bypass.py).
//
//   static_hello [WORD]   prints "static_hello ran WORD", exits 3

#include <stdio.h>

int main(int argc, char** argv) {
  printf("static_hello ran %s\n", argc > 1 ? argv[1] : "");
  return 3;
}
