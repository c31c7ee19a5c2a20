#include "tools/program_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "src/base/elf_probe.h"

namespace trafficrate {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

std::string Line(const std::string& path, const char* why) {
  return absl::StrFormat(
      "%s %s, so trafficrate cannot pace its connections (%s)", path, why,
      kBypassHelp);
}

}  // namespace

absl::StatusOr<std::string> FindProgram(const std::string& name,
                                        const char* path) {
  if (name.empty()) return absl::NotFoundError("no program named");
  if (name.find('/') != std::string::npos) return name;
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/bin:/usr/bin", ':')) {
    const std::string candidate =
        dir.empty() ? name : absl::StrCat(dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, " in PATH"));
}

std::string NotPacedLine(const std::string& name, bool library_logs_to_stderr) {
  absl::StatusOr<std::string> path = FindProgram(name, getenv("PATH"));
  if (!path.ok()) return "";
  absl::StatusOr<ProgramInfo> info = InspectProgram(*path);
  if (!info.ok()) return "";
  const char* why = WhyNotPaced(*info);
  if (why == nullptr ||
      (library_logs_to_stderr && info->kind == ProgramKind::kDynamic)) {
    return "";
  }
  return Line(*path, why);
}

std::string DescribeProgram(const std::string& name, std::string* out) {
  absl::StatusOr<std::string> path = FindProgram(name, getenv("PATH"));
  if (!path.ok()) {
    absl::StrAppendFormat(out, "  program %s: not found\n", name);
    return absl::StrCat("check: ", path.status().message());
  }
  if (!IsExecutableFile(*path)) {
    absl::StrAppendFormat(out, "  program %s: not an executable file\n", *path);
    return absl::StrCat("check: ", *path, " is not an executable file");
  }
  absl::StatusOr<ProgramInfo> info = InspectProgram(*path);
  if (!info.ok()) {
    absl::StrAppendFormat(out, "  program %s: cannot be read\n", *path);
    return absl::StrCat("check: ", info.status().message());
  }
  if (const char* why = WhyNotPaced(*info); why != nullptr) {
    absl::StrAppendFormat(out, "  program %s %s: NOT PACED\n", *path, why);
    return Line(*path, why);
  }
  switch (info->kind) {
    case ProgramKind::kDynamic:
      absl::StrAppendFormat(
          out,
          "  program %s: dynamically linked (%s): the library is "
          "loaded into it\n",
          *path, info->interpreter);
      break;
    case ProgramKind::kScript:
      absl::StrAppendFormat(
          out,
          "  program %s: a script for %s: what it starts gets the "
          "library (not inspected here)\n",
          *path, info->interpreter.empty() ? "?" : info->interpreter);
      break;
    default:
      absl::StrAppendFormat(
          out,
          "  program %s: not an ELF program (run by /bin/sh): what it "
          "starts gets the library (not inspected here)\n",
          *path);
      break;
  }
  return "";
}

}  // namespace trafficrate
