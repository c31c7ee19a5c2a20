// Where zones live (zone_file.h): a zone's file is made only in a directory
// of its user's own, never in one another user made first (a squatter), and
// found there again; a new file is reserved before use and invisible until
// published. The places are put under a private directory of the test, so
// that nothing here touches the real /dev/shm/trafficrate-UID.
//
// Squatters are played by chown to another uid: the tests that need that are
// skipped when not run as root (CI runs them as root).

#include "src/shm/zone_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/shm/zone.h"
#include "tests/shm/zone_fixture.h"

namespace trafficrate {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uid_t kOtherUid = 65534;  // nobody
constexpr uint64_t kSize = 64 * 1024;

class ZoneFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/dev/shm/zone-file-test-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    root_ = templ;
    // No /run here: the places are <root>/trafficrate-UID and its fallbacks.
    places_ = ZonePlaces::Under(geteuid(), root_ + "/no-run", root_);
    ASSERT_EQ(places_.dirs.size(), 1u);
    usual_ = places_.dirs[0];
  }
  void TearDown() override {
    const std::string cmd = absl::StrCat("rm -rf '", root_, "'");
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  bool Root() const { return geteuid() == 0; }

  // A published zone file of kSize bytes.
  std::string MakeAndPublish(absl::string_view name,
                             ZonePlaceNotes* notes = nullptr) {
    absl::StatusOr<ZoneFile> made = MakeZoneFile(places_, name, kSize, notes);
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return "";
    EXPECT_FALSE(made->published());
    EXPECT_EQ(made->Size(), static_cast<int64_t>(kSize));
    const absl::Status published = PublishZoneFile(*made);
    EXPECT_TRUE(published.ok()) << published;
    return made->path();
  }

  std::string root_;
  ZonePlaces places_;
  std::string usual_;
};

TEST_F(ZoneFileTest, RootsZonesGoToRunOnlyWhenItIsAMemoryFilesystem) {
  const ZonePlaces root = ZonePlaces::Under(0, "/dev/shm", "/dev/shm");
  ASSERT_EQ(root.dirs.size(), 2u);
  EXPECT_EQ(root.dirs[0], "/dev/shm/trafficrate");
  EXPECT_EQ(root.dirs[1], "/dev/shm/trafficrate-0");
  const ZonePlaces on_disk = ZonePlaces::Under(0, "/usr", "/dev/shm");
  ASSERT_EQ(on_disk.dirs.size(), 1u);
  EXPECT_EQ(on_disk.dirs[0], "/dev/shm/trafficrate-0");
  const ZonePlaces user = ZonePlaces::Under(1000, "/dev/shm", "/dev/shm");
  ASSERT_EQ(user.dirs.size(), 1u);
  EXPECT_EQ(user.dirs[0], "/dev/shm/trafficrate-1000");
  EXPECT_EQ(user.FallbackPrefix(), "trafficrate-1000.");
}

TEST_F(ZoneFileTest, AZoneIsMadeInTheUsersOwnDirectoryAndFoundThere) {
  const std::string path = MakeAndPublish("web");
  EXPECT_EQ(path, usual_ + "/web");
  struct stat st {};
  ASSERT_EQ(stat(usual_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kSize));
  // Reserved: every page is allocated already (no later SIGBUS).
  EXPECT_GE(st.st_blocks * 512, static_cast<blkcnt_t>(kSize));
  ZonePlaceNotes notes;
  absl::StatusOr<ZoneFile> found = FindZoneFile(places_, "web", &notes);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->path(), path);
  EXPECT_TRUE(found->published());
  EXPECT_EQ(notes.Line("web"), "");
}

TEST_F(ZoneFileTest, AnUnpublishedFileIsNeverFoundAndVanishesWithItsMaker) {
  {
    absl::StatusOr<ZoneFile> made = MakeZoneFile(places_, "half", kSize);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_TRUE(absl::IsNotFound(FindZoneFile(places_, "half").status()));
  }  // closed without publishing, as by a process that died making it
  EXPECT_TRUE(absl::IsNotFound(FindZoneFile(places_, "half").status()));
  EXPECT_EQ(ZoneFilePath(places_, "half"), usual_ + "/half");
  struct stat st {};
  EXPECT_NE(stat((usual_ + "/half").c_str(), &st), 0);
}

TEST_F(ZoneFileTest, OnlyTheFirstOfTwoMakersPublishes) {
  absl::StatusOr<ZoneFile> first = MakeZoneFile(places_, "race", kSize);
  absl::StatusOr<ZoneFile> second = MakeZoneFile(places_, "race", kSize);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(PublishZoneFile(*first).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(PublishZoneFile(*second)));
  struct stat named {
  }, ours{};
  ASSERT_EQ(stat(first->path().c_str(), &named), 0);
  ASSERT_EQ(fstat(first->fd(), &ours), 0);
  EXPECT_EQ(named.st_ino, ours.st_ino);
}

TEST_F(ZoneFileTest, RemoveIfSameLeavesAFileMadeSinceAlone) {
  const std::string path = MakeAndPublish("swap");
  absl::StatusOr<ZoneFile> old = FindZoneFile(places_, "swap");
  ASSERT_TRUE(old.ok());
  ASSERT_EQ(unlink(path.c_str()), 0);
  MakeAndPublish("swap");  // another process's, made since
  EXPECT_TRUE(RemoveZoneFileIfSame(*old).ok());
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << "the new file was removed";
  absl::StatusOr<ZoneFile> current = FindZoneFile(places_, "swap");
  ASSERT_TRUE(current.ok());
  EXPECT_TRUE(RemoveZoneFileIfSame(*current).ok());
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

// Each way another user may take the usual directory's name first: the
// zone goes to a fallback directory of the user's own, the notes say what
// was found, and the next lookup finds the zone there.
void ExpectPassedOver(const ZonePlaces& places, const std::string& usual,
                      const std::string& what) {
  ZonePlaceNotes notes;
  absl::StatusOr<ZoneFile> made = MakeZoneFile(places, "web", kSize, &notes);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(PublishZoneFile(*made).ok());
  EXPECT_THAT(made->dir(), StartsWith(absl::StrCat(places.shm, "/",
                                                   places.FallbackPrefix())));
  EXPECT_EQ(made->dir().size(), usual.size() + 7);  // ".XXXXXX"
  const std::string line = notes.Line("web");
  EXPECT_THAT(line, HasSubstr(usual));
  EXPECT_THAT(line, HasSubstr(what));
  EXPECT_THAT(line, HasSubstr(made->dir()));
  struct stat st {};
  ASSERT_EQ(stat(made->dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, places.uid);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ZonePlaceNotes found_notes;
  absl::StatusOr<ZoneFile> found = FindZoneFile(places, "web", &found_notes);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->path(), made->path());
  EXPECT_THAT(found_notes.Line("web"), HasSubstr(what));
  // A second zone goes to the same fallback directory.
  absl::StatusOr<ZoneFile> other = MakeZoneFile(places, "ftp", kSize);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->dir(), made->dir());
}

TEST_F(ZoneFileTest, ADirectoryOfAnotherUserIsPassedOver) {
  if (!Root()) GTEST_SKIP() << "needs root to play another user";
  ASSERT_EQ(mkdir(usual_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(usual_.c_str(), 0777), 0);
  ASSERT_EQ(chown(usual_.c_str(), kOtherUid, kOtherUid), 0);
  // The squatter's zone-like file in it is never used.
  const std::string bait = usual_ + "/web";
  ASSERT_EQ(close(open(bait.c_str(), O_CREAT | O_WRONLY, 0666)), 0);
  ExpectPassedOver(places_, usual_, "owned by user 65534");
  struct stat st {};
  ASSERT_EQ(stat(bait.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the squatter's file was written";
}

TEST_F(ZoneFileTest, ASymlinkIsPassedOverEvenToADirectoryOfTheUsers) {
  const std::string target = root_ + "/elsewhere";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), usual_.c_str()), 0);
  ExpectPassedOver(places_, usual_, "a symlink");
  struct stat st {};
  EXPECT_NE(stat((target + "/web").c_str(), &st), 0);
}

TEST_F(ZoneFileTest, AFileIsPassedOver) {
  ASSERT_EQ(close(open(usual_.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  ExpectPassedOver(places_, usual_, "a file");
}

TEST_F(ZoneFileTest, ADirectoryOthersCanWriteIsPassedOver) {
  ASSERT_EQ(mkdir(usual_.c_str(), 0700), 0);
  ASSERT_EQ(chmod(usual_.c_str(), 0777), 0);
  ExpectPassedOver(places_, usual_, "writable by others");
}

TEST_F(ZoneFileTest, FallbackNamesOfOtherUsersAreNeverUsed) {
  if (!Root()) GTEST_SKIP() << "needs root to play another user";
  ASSERT_EQ(close(open(usual_.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  const std::string fake =
      absl::StrCat(root_, "/", places_.FallbackPrefix(), "AAAAAA");
  ASSERT_EQ(mkdir(fake.c_str(), 0700), 0);
  ASSERT_EQ(chown(fake.c_str(), kOtherUid, kOtherUid), 0);
  absl::StatusOr<ZoneFile> made = MakeZoneFile(places_, "web", kSize);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_NE(made->dir(), fake);
}

TEST_F(ZoneFileTest, AZoneFileNotTheUsersOwnIsRefusedNamingIt) {
  if (!Root()) GTEST_SKIP() << "needs root to play another user";
  const std::string path = MakeAndPublish("web");
  ASSERT_EQ(chown(path.c_str(), kOtherUid, kOtherUid), 0);
  absl::Status found = FindZoneFile(places_, "web").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(found)) << found;
  EXPECT_THAT(found.message(), HasSubstr(path));
  EXPECT_THAT(found.message(), HasSubstr("owned by user 65534"));
  ASSERT_EQ(chown(path.c_str(), geteuid(), getegid()), 0);
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  found = FindZoneFile(places_, "web").status();
  EXPECT_THAT(found.message(), HasSubstr("open to other users (mode 0666)"));
}

TEST_F(ZoneFileTest, TooLittleRoomIsAnErrorNamingTheSizeAndTheVariable) {
  // A file size limit plays a full filesystem: posix_fallocate fails the
  // same way (EFBIG rather than ENOSPC), in a child that ignores SIGXFSZ.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{kSize / 2, kSize / 2};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    absl::StatusOr<ZoneFile> made = MakeZoneFile(places_, "big", kSize);
    const std::string message(made.status().message());
    const bool ok = absl::IsResourceExhausted(made.status()) &&
                    absl::StrContains(message, "TRAFFICRATE_ZONE_SIZE=64k") &&
                    absl::StrContains(message, "0.1 MiB") &&
                    absl::StrContains(message, usual_ + " has ");
    if (!ok) std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(absl::IsNotFound(FindZoneFile(places_, "big").status()))
      << "a half-made zone was left";
}

TEST_F(ZoneFileTest, RootFindsAZoneOfAnotherUserOnlyInThatUsersOwnDirectory) {
  if (!Root()) GTEST_SKIP() << "needs root to play another user";
  const ZonePlaces theirs =
      ZonePlaces::Under(kOtherUid, root_ + "/no-run", root_);
  const std::string dir = theirs.dirs[0];
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chown(dir.c_str(), kOtherUid, kOtherUid), 0);
  const std::string path = dir + "/web";
  ASSERT_EQ(close(open(path.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  ASSERT_EQ(chown(path.c_str(), kOtherUid, kOtherUid), 0);
  // A directory named for uid 1000 but owned by nobody: not 1000's.
  const std::string forged = root_ + "/trafficrate-1000";
  ASSERT_EQ(mkdir(forged.c_str(), 0700), 0);
  ASSERT_EQ(chown(forged.c_str(), kOtherUid, kOtherUid), 0);
  ASSERT_EQ(close(open((forged + "/web").c_str(), O_CREAT | O_WRONLY, 0600)),
            0);
  std::vector<std::string> found = FindZoneFilesOfAnyUser(places_, "web");
  EXPECT_THAT(found, ::testing::ElementsAre(path));
  const std::string own = MakeAndPublish("web");
  found = FindZoneFilesOfAnyUser(places_, "web");
  EXPECT_THAT(found, ::testing::ElementsAre(own, path));
}

TEST_F(ZoneFileTest, ZoneOpenOrCreatePutsItsZoneAsideAndSaysWhy) {
  ASSERT_EQ(close(open(usual_.c_str(), O_CREAT | O_WRONLY, 0600)), 0);
  const std::string name = testing_util::UniqueZoneName("aside");
  ZoneOpenNotes notes;
  absl::StatusOr<std::unique_ptr<Zone>> zone =
      Zone::OpenOrCreate(name, uint64_t{1} << 20, testing_util::kRate,
                         KeySpec(), &notes, &places_);
  ASSERT_TRUE(zone.ok()) << zone.status();
  EXPECT_THAT((*zone)->path(),
              StartsWith(absl::StrCat(root_, "/", places_.FallbackPrefix())));
  EXPECT_THAT(notes.placement, HasSubstr(usual_ + " is a file"));
  EXPECT_THAT(notes.placement,
              HasSubstr((*zone)->path().substr(0, (*zone)->path().rfind('/'))));
  // A second process of the server attaches the same zone.
  absl::StatusOr<std::unique_ptr<Zone>> again =
      Zone::OpenOrCreate(name, uint64_t{1} << 20, testing_util::kRate,
                         KeySpec(), nullptr, &places_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->path(), (*zone)->path());
  (*zone)->header().rate_bytes_per_sec.store(12345);
  EXPECT_EQ((*again)->header().rate_bytes_per_sec.load(), 12345u);
}

}  // namespace
}  // namespace trafficrate
