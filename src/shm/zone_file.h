// Where a zone's file lives, and how it is found, made and removed, so that
// no other local user can take a zone's name first, make a server use a file
// of theirs, or shrink a zone a server has mapped.
//
// A zone is a regular file NAME, mode 0600, in a directory that only the
// zone's user can write:
//
//   root          /run/trafficrate/NAME       (when /run is a tmpfs: a zone
//                                              on disk would outlive a reboot
//                                              with its locks still "held")
//                 /dev/shm/trafficrate-0/NAME (else, or when /run is full)
//   user UID      /dev/shm/trafficrate-UID/NAME
//
// /dev/shm is world-writable, so anyone may create /dev/shm/trafficrate-UID
// before its user does. A directory of that name that is not the user's own
// (another owner, writable by others, a symlink, a file) is never used: the
// zone goes to an unguessable /dev/shm/trafficrate-UID.XXXXXX of the user's
// instead (mkdtemp), which every process of that user, and the CLI, find by
// looking for such directories that are the user's own. Only the user (and
// root) can create, truncate or replace files in its directories, so only
// they can shrink a mapped zone (which would raise SIGBUS in its users).
//
// A new zone's file is made nameless (O_TMPFILE) in its directory, its pages
// reserved (posix_fallocate: too little space is an error here, never a
// SIGBUS later), filled in by the caller, and only then linked under its name
// (PublishZoneFile): a zone found under its name is always whole.
//
//   ZonePlaces places = ZonePlaces::ForUser(geteuid());
//   absl::StatusOr<ZoneFile> file = FindZoneFile(places, "default");
//   if (absl::IsNotFound(file.status())) file = MakeZoneFile(places, ...);
//
// Not for the hot path: everything here allocates and makes system calls.

#ifndef TRAFFICRATE_SRC_SHM_ZONE_FILE_H_
#define TRAFFICRATE_SRC_SHM_ZONE_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trafficrate {

// The places a user's zones may live, in the order they are looked at.
struct ZonePlaces {
  uid_t uid = 0;
  // Directories of the user's own: created when missing (mode 0700), used
  // only while they pass CheckOwnDir. root: {"/run/trafficrate" if /run is
  // a memory filesystem, "/dev/shm/trafficrate-0"}; others:
  // {"/dev/shm/trafficrate-UID"}.
  std::vector<std::string> dirs;
  // Where the unguessable fallback directories are made: <shm>/trafficrate-
  // UID.XXXXXX.
  std::string shm = "/dev/shm";

  // The places of user uid on this machine.
  static ZonePlaces ForUser(uid_t uid);
  // The same under other roots (tests): run_dir/trafficrate for root, and
  // shm_dir for the per-user directories.
  static ZonePlaces Under(uid_t uid, absl::string_view run_dir,
                          absl::string_view shm_dir);
  // The fallback directories' name prefix: "trafficrate-UID.".
  std::string FallbackPrefix() const;
};

// An open zone file. Movable; closes what it holds.
class ZoneFile {
 public:
  ZoneFile() = default;
  ZoneFile(int fd, int dir_fd, std::string dir, std::string name,
           bool published);
  ~ZoneFile();
  ZoneFile(ZoneFile&& other) noexcept;
  ZoneFile& operator=(ZoneFile&& other) noexcept;
  ZoneFile(const ZoneFile&) = delete;
  ZoneFile& operator=(const ZoneFile&) = delete;

  int fd() const { return fd_; }
  // Where it is (or will be, once published): DIR/NAME.
  std::string path() const;
  const std::string& dir() const { return dir_; }
  // Linked under its name (false: made by MakeZoneFile, not yet published).
  bool published() const { return published_; }
  // Its size now (fstat); -1 on error.
  int64_t Size() const;

 private:
  friend absl::Status PublishZoneFile(ZoneFile& file);
  friend absl::Status RemoveZoneFileIfSame(const ZoneFile& file);
  void Close();

  int fd_ = -1;
  int dir_fd_ = -1;
  std::string dir_;
  std::string name_;
  bool published_ = false;
};

// What the lookups found in the user's usual places that was not the user's
// own and so was passed over (a squatter's directory), one phrase each;
// empty when nothing was. For the one line a server says about it.
struct ZonePlaceNotes {
  std::vector<std::string> passed_over;
  // The directory the zone went to instead of the first usual one, when
  // passed_over is not empty.
  std::string used_dir;
  // The line to log (empty: nothing to say): what was found, and where the
  // zone lives instead.
  std::string Line(absl::string_view zone_name) const;
};

// Opens zone `name` (a ParseZoneName name) of places.uid where it lives: the
// first of the usual directories that is the user's own and holds it, else
// a fallback directory of the user's that holds it. The file must be a
// regular file of that user, not readable or writable by others; anything
// else under that name is refused (FailedPrecondition, saying what it is).
// NotFound if no place holds it.
absl::StatusOr<ZoneFile> FindZoneFile(const ZonePlaces& places,
                                      absl::string_view name,
                                      ZonePlaceNotes* notes = nullptr);

// Makes a new, unpublished zone file of size_bytes in the first usable
// place (a usual directory of the user's own, created if missing; else a
// fallback directory, made if there is none), with its pages reserved. A
// place without room for it is passed over for the next one; when none has
// room, ResourceExhausted naming the size asked, the room there was and
// TRAFFICRATE_ZONE_SIZE.
absl::StatusOr<ZoneFile> MakeZoneFile(const ZonePlaces& places,
                                      absl::string_view name,
                                      uint64_t size_bytes,
                                      ZonePlaceNotes* notes = nullptr);

// Links a file from MakeZoneFile under its name, once the caller filled it.
// AlreadyExists if another process published one first (the caller then
// opens that one instead).
absl::Status PublishZoneFile(ZoneFile& file);

// Unlinks the file's name if it still names this very file (not one another
// process made since). OK if the name is gone already.
absl::Status RemoveZoneFileIfSame(const ZoneFile& file);

// Checks an open directory: the user's own (owner uid, writable by nobody
// else). OK, or FailedPrecondition with what it is instead ("a directory
// owned by user 65534 (nobody)", "a directory writable by others (mode
// 0777)").
absl::Status CheckOwnDir(int dir_fd, uid_t uid);

// Describes what lies at path, without following a symlink there: "a
// symlink", "a regular file", "a directory owned by user 65534 (nobody),
// mode 0777", "nothing" (ENOENT).
std::string DescribePath(const std::string& path);

// A user's name and number: "65534 (nobody)", or "65534".
std::string DescribeUser(uid_t uid);

// Where the zones of every user may be, for root's CLI looking for a zone
// by name: each user directory (<shm>/trafficrate-UID and its fallbacks)
// whose owner is the uid in its name, plus places.dirs. Paths of the zone
// files named `name` found there, the caller's own places first.
std::vector<std::string> FindZoneFilesOfAnyUser(const ZonePlaces& places,
                                                absl::string_view name);

// Where MakeZoneFile would put a new zone now (nothing is made): the first
// usual directory that is the user's own or does not exist yet, else the
// user's first fallback directory, else "<shm>/trafficrate-UID.XXXXXX".
// *notes gets what was passed over on the way.
std::string NewZoneDir(const ZonePlaces& places,
                       ZonePlaceNotes* notes = nullptr);

// The path of the user's zone `name`: where it is, else where a new one
// would go now (NewZoneDir, made if missing). For tests that write a zone
// file themselves.
std::string ZoneFilePath(const ZonePlaces& places, absl::string_view name);

// "owned by user 0 (root), mode 0600".
std::string DescribeOwner(int fd);

// The file of an earlier trafficrate version, which kept zones in /dev/shm
// as POSIX shared memory objects: <shm>/trafficrate.NAME.
std::string LegacyZonePath(const ZonePlaces& places, absl::string_view name);

}  // namespace trafficrate

#endif  // TRAFFICRATE_SRC_SHM_ZONE_FILE_H_
