// Files written beside their target and renamed into place when complete (saved contexts,
// kvo-make-model's models) are "partial" until then. They carry a name that says so,
//   <target>.kvo-partial-<pid>-XXXXXX
// are removed by their owner on every failure path, by a signal handler when the program is
// interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT), and, if the process was killed outright, by the
// next writer into the same directory once the process that made them is gone.
#pragma once

#include <string>
#include <vector>

namespace kvo::offload {

// mkstemp/mkdtemp's pattern for a partial beside `target` (its trailing slashes dropped).
std::string partial_pattern(const std::string& target);

// A registered partial path, removed by remove_registered_partials() until it is unregistered
// (committed or removed by its owner). Movable, not copyable. A full registry (64 paths at once)
// leaves a path unregistered: its owner and the stale sweep still remove it.
class PartialRegistration {
 public:
  PartialRegistration() = default;
  // `directory`: the path is a directory of plain files, removed with them.
  PartialRegistration(const std::string& path, bool directory);
  ~PartialRegistration() { release(); }
  PartialRegistration(PartialRegistration&& other) noexcept : slot_(other.slot_) {
    other.slot_ = -1;
  }
  PartialRegistration& operator=(PartialRegistration&& other) noexcept;
  PartialRegistration(const PartialRegistration&) = delete;
  PartialRegistration& operator=(const PartialRegistration&) = delete;
  // Forgets the path (it was committed, or removed by its owner).
  void release() noexcept;

 private:
  int slot_ = -1;
};

// Removes every registered path. Async-signal-safe (system calls only).
void remove_registered_partials() noexcept;

// For programs, not for a library inside someone else's: installs handlers for SIGINT, SIGTERM,
// SIGHUP and SIGQUIT that remove the registered partials and then end the program by the same
// signal, as it would have ended without them; and ignores SIGXFSZ, so that a write past a
// file-size limit (ulimit -f) fails with EFBIG, which the writer reports, instead of killing.
void install_partial_cleanup();

// Removes the partials in `dir` whose process no longer runs and that have not been written for
// a minute (a partial of a live save elsewhere, say another PID namespace, is left alone).
// Returns the names removed.
std::vector<std::string> remove_stale_partials(const std::string& dir);

// The directory `path` is in ("." for a bare name).
std::string directory_of(const std::string& path);

}  // namespace kvo::offload
