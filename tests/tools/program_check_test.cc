// What `trafficrate run` and `check` say of the program they are given
// (tools/program_check.h).

#include "tools/program_check.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/base/elf_probe.h"

namespace trafficrate {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A scratch directory with files of given modes, removed at the end.
class ProgramCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/program_check_test.", getpid());
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir((dir_ + "/a").c_str(), 0700), 0);
    ASSERT_EQ(mkdir((dir_ + "/b").c_str(), 0700), 0);
  }
  void TearDown() override {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir((dir_ + "/a").c_str());
    rmdir((dir_ + "/b").c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& relative, mode_t mode,
                    const std::string& contents = "#!/bin/sh\n") {
    const std::string path = absl::StrCat(dir_, "/", relative);
    std::ofstream(path) << contents;
    chmod(path.c_str(), mode);
    files_.push_back(path);
    return path;
  }

  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(ProgramCheckTest, FindsAsExecvpDoes) {
  Write("a/prog", 0644);  // not executable: skipped
  const std::string b = Write("b/prog", 0755);
  const std::string path = absl::StrCat(dir_, "/a:", dir_, "/b");
  absl::StatusOr<std::string> found = FindProgram("prog", path.c_str());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, b);

  // A name with a slash is taken as it is, found or not.
  EXPECT_EQ(*FindProgram("./x/prog", path.c_str()), "./x/prog");
  EXPECT_EQ(*FindProgram("/bin/true", ""), "/bin/true");

  // A directory is not a program.
  EXPECT_FALSE(FindProgram("a", dir_.c_str()).ok());

  absl::StatusOr<std::string> missing = FindProgram("nosuchprog", path.c_str());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "cannot find nosuchprog in PATH");
  EXPECT_FALSE(FindProgram("", path.c_str()).ok());
}

TEST_F(ProgramCheckTest, DefaultPathAndCurrentDirectory) {
  // PATH unset: glibc's default, /bin:/usr/bin.
  EXPECT_EQ(*FindProgram("true", nullptr), "/bin/true");
  // An empty entry is the current directory.
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  Write("a/here", 0755);
  ASSERT_EQ(chdir((dir_ + "/a").c_str()), 0);
  absl::StatusOr<std::string> found = FindProgram("here", "/nonexistent::");
  EXPECT_EQ(chdir(cwd), 0);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "here");
}

TEST_F(ProgramCheckTest, OneLineForAProgramThatCannotBePaced) {
  const std::string line = NotPacedLine(TRAFFICRATE_FAKE_GO, false);
  EXPECT_EQ(line, absl::StrCat(TRAFFICRATE_FAKE_GO,
                               " is a Go program: it makes its system calls "
                               "itself, so trafficrate cannot pace its "
                               "connections (",
                               kBypassHelp, ")"));
  // Dynamically linked, it loads the library, which says the same on the
  // same stderr.
  EXPECT_EQ(NotPacedLine(TRAFFICRATE_FAKE_GO, true), "");
  if (std::strlen(TRAFFICRATE_STATIC_HELLO) != 0) {
    for (bool library_logs_to_stderr : {false, true}) {
      EXPECT_THAT(
          NotPacedLine(TRAFFICRATE_STATIC_HELLO, library_logs_to_stderr),
          HasSubstr(" is statically linked: the library cannot be "
                    "loaded into it, so trafficrate cannot pace"));
    }
  }
  EXPECT_EQ(NotPacedLine("/bin/true", false), "");
  EXPECT_EQ(NotPacedLine(Write("script", 0755), false), "");
  EXPECT_EQ(NotPacedLine("nosuchprog-program-check-test", false), "");
}

TEST_F(ProgramCheckTest, CheckDescribesTheProgram) {
  std::string out;
  EXPECT_EQ(DescribeProgram("/bin/true", &out), "");
  EXPECT_EQ(out,
            "  program /bin/true: dynamically linked "
            "(/lib64/ld-linux-x86-64.so.2): the library is loaded into it\n");

  out.clear();
  const std::string script = Write("script", 0755, "#!/bin/bash -e\n");
  EXPECT_EQ(DescribeProgram(script, &out), "");
  EXPECT_THAT(out, HasSubstr(": a script for /bin/bash: what it starts"));

  out.clear();
  EXPECT_THAT(
      DescribeProgram(TRAFFICRATE_FAKE_GO, &out),
      StartsWith(absl::StrCat(TRAFFICRATE_FAKE_GO, " is a Go program")));
  EXPECT_THAT(out, EndsWith(": NOT PACED\n"));

  out.clear();
  EXPECT_EQ(DescribeProgram("nosuchprog-program-check-test", &out),
            "check: cannot find nosuchprog-program-check-test in PATH");
  EXPECT_EQ(out, "  program nosuchprog-program-check-test: not found\n");

  out.clear();
  const std::string plain = Write("plain", 0644);
  EXPECT_EQ(DescribeProgram(plain, &out),
            absl::StrCat("check: ", plain, " is not an executable file"));
}

}  // namespace
}  // namespace trafficrate
