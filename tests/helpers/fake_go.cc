// Test helper: a dynamically linked C++ program with a section named as the
// Go linker names its build information (.go.buildinfo), so that
// src/base/elf_probe.h takes it for a Go program (tests/base/elf_probe_test.cc,
// tests/integration/test_bypass.py: the library's start-up line).
//
//   fake_go [WORD]   prints "fake_go ran WORD", exits 0

#include <stdio.h>

// What Go 1.18+ puts at the start of the section: 14 bytes of magic, the
// pointer size and a flags byte.
__attribute__((section(".go.buildinfo"),
               used)) static const char kBuildInfo[32] =
    "\xff Go buildinf:\x08\x02";

int main(int argc, char** argv) {
  printf("fake_go ran %s\n", argc > 1 ? argv[1] : "");
  return 0;
}
