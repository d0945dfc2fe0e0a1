#include "offload/util/partial_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

namespace kvo::offload {

namespace {

constexpr const char* kMarker = ".kvo-partial-";
constexpr int kSlots = 64;
constexpr std::size_t kPathBytes = 4096;

// state: 0 free, 1 being written by its owner, 2 registered (the signal handler may read it).
struct Slot {
  std::atomic<int> state{0};
  bool directory = false;
  char path[kPathBytes] = {0};
};
Slot g_slots[kSlots];

// Removes the plain files of a directory, then the directory: system calls only, so that a
// signal handler may call it.
void remove_directory(const char* path) noexcept {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    alignas(8) char buffer[8192];
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
        unsigned short reclen = 0;
        std::memcpy(&reclen, buffer + at + 16, sizeof reclen);
        const char* name = buffer + at + 19;
        if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0) {
          ::unlinkat(fd, name, 0);
        }
        at += reclen;
      }
    }
    ::close(fd);
  }
  ::rmdir(path);
}

void remove_path(const char* path, bool directory) noexcept {
  if (directory) {
    remove_directory(path);
  } else {
    ::unlink(path);
  }
}

const int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

extern "C" void on_fatal_signal(int sig) {
  remove_registered_partials();
  // End as the signal would have ended the program: its default action, once this returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

std::string partial_pattern(const std::string& target) {
  std::string base = target;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + kMarker + std::to_string(::getpid()) + "-XXXXXX";
}

std::string directory_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

PartialRegistration::PartialRegistration(const std::string& path, bool directory) {
  if (path.size() >= kPathBytes) return;
  for (int i = 0; i < kSlots; ++i) {
    int free_state = 0;
    if (g_slots[i].state.compare_exchange_strong(free_state, 1, std::memory_order_acquire)) {
      g_slots[i].directory = directory;
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(2, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
}

PartialRegistration& PartialRegistration::operator=(PartialRegistration&& other) noexcept {
  if (this != &other) {
    release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void PartialRegistration::release() noexcept {
  if (slot_ < 0) return;
  g_slots[slot_].state.store(0, std::memory_order_release);
  slot_ = -1;
}

void remove_registered_partials() noexcept {
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) == 2) remove_path(slot.path, slot.directory);
  }
}

void install_partial_cleanup() {
  for (const int sig : kCleanupSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    // A signal the program was started with ignored (nohup's SIGHUP) stays ignored.
    if (old.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
  std::signal(SIGXFSZ, SIG_IGN);
}

std::vector<std::string> remove_stale_partials(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  const std::time_t now = std::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const char* marker = std::strstr(e->d_name, kMarker);
    if (marker == nullptr) continue;
    const char* digits = marker + std::strlen(kMarker);
    long pid = 0;
    const char* p = digits;
    while (*p >= '0' && *p <= '9' && pid < (1L << 30)) pid = pid * 10 + (*p++ - '0');
    if (p == digits || *p != '-' || pid <= 0) continue;
    if (pid == ::getpid()) continue;                                          // ours, in use
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // it runs
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || now - st.st_mtime < 60) continue;
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) continue;
    remove_path(path.c_str(), S_ISDIR(st.st_mode));
    removed.emplace_back(e->d_name);
  }
  ::closedir(d);
  return removed;
}

}  // namespace kvo::offload
