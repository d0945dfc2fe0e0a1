// Partial files: what a save writes before its rename. They carry a name that says what they are,
// never replace anything but a regular file, and are removed by their owner on failure, by the
// signal handler when a program is interrupted, and by the next writer once their process is gone.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "expect_error.hpp"
#include "kvoffload/error.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/partial_files.hpp"

namespace kvo::offload {
namespace {

using kvo::testing::expect_error;

std::string temp_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "kvo_partial_" + name + "_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// The pid of a process that has exited (and been reaped): no process has it now.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

void make_old(const std::string& path) {
  struct utimbuf times {};
  times.actime = times.modtime = 1000;  // 1970: long unwritten
  ::utime(path.c_str(), &times);
}

TEST(PartialFiles, ASaveNeverReplacesWhatIsNotARegularFile) {
  const std::string dir = temp_dir("replace");
  const std::string fifo = dir + "/fifo";
  const std::string link = dir + "/link";
  const std::string sub = dir + "/sub";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(::symlink("/dev/null", link.c_str()), 0);
  ::mkdir(sub.c_str(), 0755);
  for (const auto& [target, what] : {std::pair<std::string, std::string>{fifo, "a FIFO"},
                                     {link, "a symbolic link"},
                                     {sub, "a directory"},
                                     {"/dev/null", "a character device"}}) {
    const std::string path = target, kind = what;  // lambdas cannot capture bindings in C++17
    expect_error([&] { AtomicFileSink sink(path); }, ErrorCode::kInvalidArgument,
                 "it is " + kind + ", and a save only ever replaces a regular file");
    expect_error([&] { AtomicFileSink::check_path(path); }, ErrorCode::kInvalidArgument, kind);
  }
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  expect_error([&] { AtomicFileSink sink(""); }, ErrorCode::kInvalidArgument, "empty path");
}

TEST(PartialFiles, AFailedSaveLeavesNothingAndACommittedOneReplacesTheFile) {
  const std::string dir = temp_dir("commit");
  const std::string target = dir + "/ctx.kvo";
  std::ofstream(target) << "old";
  {
    AtomicFileSink sink(target);
    sink.write("new", 3);
  }  // not committed: removed
  std::string left;
  for (const std::string& name : remove_stale_partials(dir)) left += name;
  EXPECT_EQ(left, "");
  {
    AtomicFileSink sink(target);
    sink.write("new", 3);
    sink.commit();
  }
  std::ifstream in(target);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "new");
  // Nothing but the target is in the directory.
  EXPECT_EQ(::rmdir(dir.c_str()), -1);
  EXPECT_EQ(std::remove(target.c_str()), 0);
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

// A program interrupted mid-save removes its partial file and still dies of the signal.
TEST(PartialFiles, AnInterruptedProgramRemovesItsPartials) {
  const std::string dir = temp_dir("signal");
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      install_partial_cleanup();
      AtomicFileSink sink(dir + "/ctx.kvo");
      sink.write("rows", 4);
      const std::string partial_dir = dir + "/model.kvo-partial-dir";
      ::mkdir(partial_dir.c_str(), 0755);
      std::ofstream(partial_dir + "/config.json") << "{}";
      PartialRegistration registration(partial_dir, true);
      if (::write(ready[1], "x", 1) != 1) ::_exit(4);  // the partials exist now
      ::raise(sig);
      ::_exit(3);  // not reached: the signal ends the program
    }
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_FALSE(exists(dir + "/model.kvo-partial-dir"));
    // Nothing is left in the directory: the partial file went with the signal.
    EXPECT_EQ(::rmdir(dir.c_str()), 0) << "left behind after signal " << sig;
    ::mkdir(dir.c_str(), 0755);
  }
}

// A partial left by a process killed outright (SIGKILL) is removed by the next save into the
// directory once that process is gone; one of a live process, or a fresh one, is left alone.
TEST(PartialFiles, StalePartialsOfGoneProcessesAreRemovedByTheNextSave) {
  const std::string dir = temp_dir("stale");
  const std::string stale = dir + "/ctx.kvo.kvo-partial-" + std::to_string(dead_pid()) + "-Ab12Cd";
  const std::string stale_dir =
      dir + "/model.kvo-partial-" + std::to_string(dead_pid()) + "-Zz99Yy";
  const std::string live = dir + "/ctx.kvo.kvo-partial-" + std::to_string(::getppid()) + "-Ef34Gh";
  const std::string fresh = dir + "/ctx.kvo.kvo-partial-" + std::to_string(dead_pid()) + "-Ij56Kl";
  const std::string other = dir + "/notes.txt";
  for (const std::string& path : {stale, live, fresh, other}) std::ofstream(path) << "x";
  ::mkdir(stale_dir.c_str(), 0755);
  std::ofstream(stale_dir + "/model.safetensors") << "x";
  for (const std::string& path : {stale, stale_dir, live, other}) make_old(path);
  {
    AtomicFileSink sink(dir + "/ctx.kvo");
    sink.write("new", 3);
    sink.commit();
  }
  EXPECT_FALSE(exists(stale));
  EXPECT_FALSE(exists(stale_dir));
  EXPECT_TRUE(exists(live));   // its process runs
  EXPECT_TRUE(exists(fresh));  // written within the minute: maybe a save in another namespace
  EXPECT_TRUE(exists(other));  // not a partial
}

}  // namespace
}  // namespace kvo::offload
