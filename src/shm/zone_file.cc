#include "src/shm/zone_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "src/base/units.h"

namespace trafficrate {
namespace {

bool OnMemoryFilesystem(const std::string& path) {
  struct statfs fs {};
  return statfs(path.c_str(), &fs) == 0 &&
         (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
}

// Opens directory `path` (never through a symlink) if it is the user's own;
// with `create`, makes it first (mode 0700) when missing. -1 if it is not
// there or not the user's own: then *found (if not null) says what is there
// instead, unless nothing is.
int OpenOwnDir(const std::string& path, uid_t uid, bool create,
               std::string* found) {
  if (create && mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    // Its parent is missing or not writable: not a place for zones here.
    return -1;
  }
  const int fd =
      open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && found != nullptr) {
      *found = absl::StrCat(path, " is ", DescribePath(path));
    }
    return -1;
  }
  const absl::Status own = CheckOwnDir(fd, uid);
  if (!own.ok()) {
    if (found != nullptr) *found = absl::StrCat(path, " is ", own.message());
    close(fd);
    return -1;
  }
  return fd;
}

// The user's fallback directories (<shm>/trafficrate-UID.XXXXXX) that are
// its own, by name; others' of that name are passed over silently (only
// the usual names are taken by a squatter to some effect).
std::vector<std::string> OwnFallbackDirs(const ZonePlaces& places) {
  std::vector<std::string> dirs;
  DIR* shm = opendir(places.shm.c_str());
  if (shm == nullptr) return dirs;
  const std::string prefix = places.FallbackPrefix();
  // Bounded: a directory another user floods with names costs a scan, and
  // only as many of them as this.
  constexpr int kMaxEntries = 1 << 16;
  int seen = 0;
  while (dirent* e = readdir(shm)) {
    if (++seen > kMaxEntries) break;
    if (absl::StartsWith(e->d_name, prefix)) {
      dirs.push_back(absl::StrCat(places.shm, "/", e->d_name));
    }
  }
  closedir(shm);
  std::sort(dirs.begin(), dirs.end());
  dirs.erase(std::remove_if(dirs.begin(), dirs.end(),
                            [&](const std::string& dir) {
                              const int fd =
                                  OpenOwnDir(dir, places.uid, false, nullptr);
                              if (fd >= 0) close(fd);
                              return fd < 0;
                            }),
             dirs.end());
  return dirs;
}

// Opens zone file `name` in an open directory of the user's: NotFound if
// it is not there; FailedPrecondition if what is there is not a zone file of
// the user's.
absl::StatusOr<int> OpenFileIn(int dir_fd, const std::string& dir,
                               absl::string_view name, uid_t uid) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string file(name);
  const int fd = openat(dir_fd, file.c_str(),
                        O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(path);
    if (err == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is a symlink, not a zone"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("open ", path));
  }
  struct stat st {};
  std::string wrong;
  if (fstat(fd, &st) != 0) {
    wrong = absl::StrCat("cannot be examined (", strerror(errno), ")");
  } else if (!S_ISREG(st.st_mode)) {
    wrong = "not a regular file";
  } else if (st.st_uid != uid) {
    wrong = absl::StrCat("owned by user ", DescribeUser(st.st_uid),
                         ", not by user ", DescribeUser(uid));
  } else if ((st.st_mode & 077) != 0) {
    wrong =
        absl::StrFormat("open to other users (mode %04o)", st.st_mode & 07777);
  }
  if (!wrong.empty()) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", wrong, "; it is not used as a zone"));
  }
  return fd;
}

std::string Mebibytes(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// "DIR has 60.0 MiB free of 64.0 MiB".
std::string Room(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return absl::StrCat(dir, " has ? free");
  return absl::StrFormat("%s has %s free of %s", dir,
                         Mebibytes(uint64_t{vfs.f_bavail} * vfs.f_frsize),
                         Mebibytes(uint64_t{vfs.f_blocks} * vfs.f_frsize));
}

// A new nameless file in an open directory, size_bytes reserved. *no_room
// is set when the filesystem had no room for it.
absl::StatusOr<ZoneFile> MakeIn(int dir_fd, const std::string& dir,
                                absl::string_view name, uint64_t size_bytes,
                                bool* no_room) {
  *no_room = false;
  const int fd = openat(dir_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot make a zone file in ", dir));
  }
  // posix_fallocate: on tmpfs the pages are allocated now, so that a full
  // filesystem is this error, never a SIGBUS at a later touch.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
  if (err != 0) {
    close(fd);
    if (err == ENOSPC || err == EFBIG || err == ENOMEM || err == EDQUOT) {
      *no_room = true;
    }
    return absl::ErrnoToStatus(
        err, absl::StrFormat("cannot reserve %s for a zone in %s",
                             Mebibytes(size_bytes), dir));
  }
  const int kept_dir = dup(dir_fd);
  if (kept_dir < 0) {
    const int dup_err = errno;
    close(fd);
    return absl::ErrnoToStatus(dup_err, "dup");
  }
  return ZoneFile(fd, kept_dir, dir, std::string(name), /*published=*/false);
}

}  // namespace

ZonePlaces ZonePlaces::Under(uid_t uid, absl::string_view run_dir,
                             absl::string_view shm_dir) {
  ZonePlaces places;
  places.uid = uid;
  places.shm = std::string(shm_dir);
  if (uid == 0 && OnMemoryFilesystem(std::string(run_dir))) {
    places.dirs.push_back(absl::StrCat(run_dir, "/trafficrate"));
  }
  places.dirs.push_back(absl::StrCat(shm_dir, "/trafficrate-", uid));
  return places;
}

ZonePlaces ZonePlaces::ForUser(uid_t uid) {
  return Under(uid, "/run", "/dev/shm");
}

std::string ZonePlaces::FallbackPrefix() const {
  return absl::StrCat("trafficrate-", uid, ".");
}

ZoneFile::ZoneFile(int fd, int dir_fd, std::string dir, std::string name,
                   bool published)
    : fd_(fd),
      dir_fd_(dir_fd),
      dir_(std::move(dir)),
      name_(std::move(name)),
      published_(published) {}

ZoneFile::~ZoneFile() { Close(); }

ZoneFile::ZoneFile(ZoneFile&& other) noexcept { *this = std::move(other); }

ZoneFile& ZoneFile::operator=(ZoneFile&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    dir_fd_ = std::exchange(other.dir_fd_, -1);
    dir_ = std::move(other.dir_);
    name_ = std::move(other.name_);
    published_ = other.published_;
  }
  return *this;
}

void ZoneFile::Close() {
  if (fd_ >= 0) close(fd_);
  if (dir_fd_ >= 0) close(dir_fd_);
  fd_ = dir_fd_ = -1;
}

std::string ZoneFile::path() const { return absl::StrCat(dir_, "/", name_); }

int64_t ZoneFile::Size() const {
  struct stat st {};
  return fstat(fd_, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string ZonePlaceNotes::Line(absl::string_view zone_name) const {
  if (passed_over.empty() || used_dir.empty()) return "";
  return absl::StrFormat(
      "%s: not this user's own, so never used (another local user may have "
      "made it); zone %s lives in %s instead",
      absl::StrJoin(passed_over, "; "), zone_name, used_dir);
}

std::string DescribeUser(uid_t uid) {
  char buf[1024];
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return absl::StrFormat("%u (%s)", uid, found->pw_name);
  }
  return absl::StrCat(uid);
}

std::string DescribePath(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? "nothing"
                           : absl::StrCat("unreadable (", strerror(errno), ")");
  }
  const std::string owner =
      absl::StrFormat("owned by user %s, mode %04o", DescribeUser(st.st_uid),
                      st.st_mode & 07777);
  if (S_ISLNK(st.st_mode)) {
    char target[256] = {};
    const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    return absl::StrFormat("a symlink%s owned by user %s",
                           n > 0 ? absl::StrCat(" to ", target) : "",
                           DescribeUser(st.st_uid));
  }
  if (S_ISDIR(st.st_mode)) return absl::StrCat("a directory ", owner);
  if (S_ISREG(st.st_mode)) return absl::StrCat("a file ", owner);
  return absl::StrCat("a special file ", owner);
}

absl::Status CheckOwnDir(int dir_fd, uid_t uid) {
  struct stat st {};
  if (fstat(dir_fd, &st) != 0) return absl::ErrnoToStatus(errno, "fstat");
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError("not a directory");
  }
  if (st.st_uid != uid) {
    return absl::FailedPreconditionError(
        absl::StrFormat("a directory owned by user %s, mode %04o",
                        DescribeUser(st.st_uid), st.st_mode & 07777));
  }
  if ((st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a directory writable by others (mode %04o)", st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::StatusOr<ZoneFile> FindZoneFile(const ZonePlaces& places,
                                      absl::string_view name,
                                      ZonePlaceNotes* notes) {
  ZonePlaceNotes local;
  std::vector<std::string> dirs = places.dirs;
  const std::vector<std::string> fallbacks = OwnFallbackDirs(places);
  dirs.insert(dirs.end(), fallbacks.begin(), fallbacks.end());
  for (const std::string& dir : dirs) {
    std::string found;
    const int dir_fd = OpenOwnDir(dir, places.uid, /*create=*/false, &found);
    if (dir_fd < 0) {
      if (!found.empty()) local.passed_over.push_back(found);
      continue;
    }
    absl::StatusOr<int> fd = OpenFileIn(dir_fd, dir, name, places.uid);
    if (absl::IsNotFound(fd.status())) {
      close(dir_fd);
      continue;
    }
    if (!fd.ok()) {
      close(dir_fd);
      return fd.status();
    }
    local.used_dir = dir;
    if (notes != nullptr) *notes = std::move(local);
    return ZoneFile(*fd, dir_fd, dir, std::string(name), /*published=*/true);
  }
  if (notes != nullptr) *notes = std::move(local);
  return absl::NotFoundError(absl::StrCat("no zone ", name, " of user ",
                                          DescribeUser(places.uid), " in ",
                                          absl::StrJoin(places.dirs, " or ")));
}

absl::StatusOr<ZoneFile> MakeZoneFile(const ZonePlaces& places,
                                      absl::string_view name,
                                      uint64_t size_bytes,
                                      ZonePlaceNotes* notes) {
  ZonePlaceNotes local;
  std::vector<std::string> full;
  absl::Status last = absl::OkStatus();
  // The usual directories, then (only when none of them was the user's
  // own) a fallback directory.
  bool any_own = false;
  auto try_dir = [&](const std::string& dir,
                     int dir_fd) -> absl::StatusOr<ZoneFile> {
    bool no_room = false;
    absl::StatusOr<ZoneFile> made =
        MakeIn(dir_fd, dir, name, size_bytes, &no_room);
    close(dir_fd);
    if (no_room) full.push_back(Room(dir));
    if (!made.ok()) last = made.status();
    return made;
  };
  for (const std::string& dir : places.dirs) {
    std::string found;
    const int dir_fd = OpenOwnDir(dir, places.uid, /*create=*/true, &found);
    if (dir_fd < 0) {
      if (!found.empty()) local.passed_over.push_back(found);
      continue;
    }
    any_own = true;
    absl::StatusOr<ZoneFile> made = try_dir(dir, dir_fd);
    if (made.ok()) {
      local.used_dir = dir;
      if (notes != nullptr) *notes = std::move(local);
      return made;
    }
  }
  if (!any_own) {
    std::vector<std::string> fallbacks = OwnFallbackDirs(places);
    if (fallbacks.empty()) {
      std::string templ =
          absl::StrCat(places.shm, "/", places.FallbackPrefix(), "XXXXXX");
      if (mkdtemp(templ.data()) != nullptr) fallbacks.push_back(templ);
    }
    for (const std::string& dir : fallbacks) {
      const int dir_fd = OpenOwnDir(dir, places.uid, /*create=*/false, nullptr);
      if (dir_fd < 0) continue;
      absl::StatusOr<ZoneFile> made = try_dir(dir, dir_fd);
      if (made.ok()) {
        local.used_dir = dir;
        if (notes != nullptr) *notes = std::move(local);
        return made;
      }
      break;
    }
  }
  absl::Status error = last;
  if (!full.empty()) {
    error = absl::ResourceExhaustedError(absl::StrFormat(
        "zone %s needs %s (TRAFFICRATE_ZONE_SIZE=%s) but %s; lower "
        "TRAFFICRATE_ZONE_SIZE or make room",
        name, Mebibytes(size_bytes), FormatByteCount(size_bytes, true),
        absl::StrJoin(full, ", ")));
  } else if (error.ok()) {
    error = absl::FailedPreconditionError(absl::StrFormat(
        "no place for zone %s: %s, and no directory of this user's could be "
        "made in %s",
        name,
        local.passed_over.empty()
            ? absl::StrCat(absl::StrJoin(places.dirs, ", "),
                           " could not be made")
            : absl::StrJoin(local.passed_over, "; "),
        places.shm));
  }
  if (notes != nullptr) *notes = std::move(local);
  return error;
}

absl::Status PublishZoneFile(ZoneFile& file) {
  char proc_path[64];
  std::snprintf(proc_path, sizeof(proc_path), "/proc/self/fd/%d", file.fd_);
  int rc = linkat(AT_FDCWD, proc_path, file.dir_fd_, file.name_.c_str(),
                  AT_SYMLINK_FOLLOW);
  if (rc != 0 && errno == ENOENT) {
    // No /proc (a chroot): root may link an fd itself.
    rc = linkat(file.fd_, "", file.dir_fd_, file.name_.c_str(), AT_EMPTY_PATH);
  }
  if (rc != 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(file.path());
    return absl::ErrnoToStatus(errno, absl::StrCat("link ", file.path()));
  }
  file.published_ = true;
  return absl::OkStatus();
}

absl::Status RemoveZoneFileIfSame(const ZoneFile& file) {
  struct stat ours {
  }, named{};
  if (fstat(file.fd_, &ours) != 0) return absl::ErrnoToStatus(errno, "fstat");
  if (fstatat(file.dir_fd_, file.name_.c_str(), &named, AT_SYMLINK_NOFOLLOW) !=
      0) {
    return errno == ENOENT ? absl::OkStatus()
                           : absl::ErrnoToStatus(errno, file.path());
  }
  if (ours.st_dev != named.st_dev || ours.st_ino != named.st_ino) {
    return absl::OkStatus();
  }
  if (unlinkat(file.dir_fd_, file.name_.c_str(), 0) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("unlink ", file.path()));
  }
  return absl::OkStatus();
}

std::vector<std::string> FindZoneFilesOfAnyUser(const ZonePlaces& places,
                                                absl::string_view name) {
  std::vector<std::string> paths;
  if (absl::StatusOr<ZoneFile> own = FindZoneFile(places, name); own.ok()) {
    paths.push_back(own->path());
  }
  if (places.uid != 0) return paths;
  DIR* shm = opendir(places.shm.c_str());
  if (shm == nullptr) return paths;
  std::vector<std::string> found;
  constexpr int kMaxEntries = 1 << 16;
  int seen = 0;
  while (dirent* e = readdir(shm)) {
    if (++seen > kMaxEntries) break;
    absl::string_view entry = e->d_name;
    if (!absl::ConsumePrefix(&entry, "trafficrate-")) continue;
    const absl::string_view digits = entry.substr(0, entry.find('.'));
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(digits, &uid) || uid == places.uid) continue;
    const std::string dir = absl::StrCat(places.shm, "/", e->d_name);
    // Only a directory that is the user's own whose number it bears.
    const int dir_fd = OpenOwnDir(dir, uid, /*create=*/false, nullptr);
    if (dir_fd < 0) continue;
    absl::StatusOr<int> fd = OpenFileIn(dir_fd, dir, name, uid);
    close(dir_fd);
    if (fd.ok()) {
      close(*fd);
      found.push_back(absl::StrCat(dir, "/", name));
    }
  }
  closedir(shm);
  std::sort(found.begin(), found.end());
  paths.insert(paths.end(), found.begin(), found.end());
  return paths;
}

std::string NewZoneDir(const ZonePlaces& places, ZonePlaceNotes* notes) {
  ZonePlaceNotes local;
  std::string dir;
  for (const std::string& usual : places.dirs) {
    std::string found;
    const int dir_fd = OpenOwnDir(usual, places.uid, /*create=*/false, &found);
    if (dir_fd >= 0) close(dir_fd);
    if (dir_fd >= 0 || found.empty()) {
      dir = usual;
      break;
    }
    local.passed_over.push_back(found);
  }
  if (dir.empty()) {
    const std::vector<std::string> fallbacks = OwnFallbackDirs(places);
    dir = !fallbacks.empty() ? fallbacks[0]
                             : absl::StrCat(places.shm, "/",
                                            places.FallbackPrefix(), "XXXXXX");
  }
  local.used_dir = dir;
  if (notes != nullptr) *notes = std::move(local);
  return dir;
}

std::string ZoneFilePath(const ZonePlaces& places, absl::string_view name) {
  if (absl::StatusOr<ZoneFile> found = FindZoneFile(places, name); found.ok()) {
    return found->path();
  }
  std::string dir = NewZoneDir(places);
  if (absl::EndsWith(dir, "XXXXXX") && mkdtemp(dir.data()) == nullptr) {
    return absl::StrCat(dir, "/", name);
  }
  mkdir(dir.c_str(), 0700);
  return absl::StrCat(dir, "/", name);
}

std::string DescribeOwner(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return "owner unknown";
  return absl::StrFormat("owned by user %s, mode %04o", DescribeUser(st.st_uid),
                         st.st_mode & 07777);
}

std::string LegacyZonePath(const ZonePlaces& places, absl::string_view name) {
  return absl::StrCat(places.shm, "/trafficrate.", name);
}

}  // namespace trafficrate
