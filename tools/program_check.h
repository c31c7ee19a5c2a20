// `trafficrate run` and `check` look at the program they are given: found
// as execvp finds it, inspected (src/base/elf_probe.h), and one line when the
// library cannot pace it (a Go program, a static one, another machine's).
//
//   const std::string line = NotPacedLine(command[0]);
//   if (!line.empty()) std::fprintf(stderr, "trafficrate: %s\n", line.c_str());

#ifndef TRAFFICRATE_TOOLS_PROGRAM_CHECK_H_
#define TRAFFICRATE_TOOLS_PROGRAM_CHECK_H_

#include <string>

#include "absl/base/attributes.h"
#include "absl/status/statusor.h"

namespace trafficrate {

// Where execvp would find `name`: `name` itself if it holds a '/', else
// the first directory of `path` (a PATH value; nullptr: "/bin:/usr/bin",
// glibc's default; an empty entry is the current directory) that holds an
// executable regular file of that name. NotFoundError naming it if none.
ABSL_MUST_USE_RESULT absl::StatusOr<std::string> FindProgram(
    const std::string& name, const char* path);

// The line (without "trafficrate: ") saying that `name`, found through
// $PATH, will not be paced and where to read what to do; "" when nothing
// known stands in the way, or it cannot be found or read, or when the
// library will say it on the same stderr: a dynamically linked Go program
// loads the library, which logs the same line (with its pid) at start-up,
// so with `library_logs_to_stderr` run leaves that one to it.
std::string NotPacedLine(const std::string& name, bool library_logs_to_stderr);

// What `check -- COMMAND` says of the program: appends its line to the
// configuration (`out`, "  program ..."), and returns the line for stderr
// when it will not be paced or cannot be found ("" otherwise).
std::string DescribeProgram(const std::string& name, std::string* out);

}  // namespace trafficrate

#endif  // TRAFFICRATE_TOOLS_PROGRAM_CHECK_H_
