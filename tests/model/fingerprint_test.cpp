// The digests a saved context's fingerprint carries: every byte of the weights counts, the
// digest is cached beside the checkpoint and recomputed when a file changes, and the tokenizer
// files count too.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <fstream>
#include <random>
#include <string>

#include "model/checkpoint/fingerprint.hpp"

namespace kvo::model {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "kvo_fingerprint_" + name + "_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Random bytes, more than one 64 MiB block so that the blocks are hashed on several threads.
std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t r = rng();
    for (std::size_t k = 0; k < 8 && i + k < n; ++k) out[i + k] = static_cast<char>(r >> (8 * k));
  }
  return out;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Fingerprint, EveryByteOfTheWeightsCounts) {
  const std::string a = temp_dir("a");
  const std::string b = temp_dir("b");
  std::string weights = random_bytes((64u << 20) + 12345, 1);
  write(a + "/model.safetensors", weights);
  weights[(64u << 20) + 100] ^= 1;  // one bit, in the second block
  write(b + "/model.safetensors", weights);
  const Digest da = weights_digest(a);
  const Digest db = weights_digest(b);
  EXPECT_EQ(da.size(), 32u);
  EXPECT_NE(da, db);
  EXPECT_NE(file_digest(a + "/model.safetensors"), file_digest(b + "/model.safetensors"));
  // The same bytes give the same digest wherever they are.
  write(b + "/model.safetensors", random_bytes((64u << 20) + 12345, 1));
  EXPECT_EQ(weights_digest(b), da);
}

TEST(Fingerprint, TheDigestIsCachedBesideTheCheckpointUntilAFileChanges) {
  const std::string dir = temp_dir("cache");
  const std::string path = dir + "/model.safetensors";
  write(path, random_bytes(4096, 2));
  const Digest first = weights_digest(dir);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/kvoffload-fingerprint.json").c_str(), &st), 0);
  // Same size and times, other bytes: the cache answers (it is keyed by size, mtime and inode).
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('x');
  }
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(weights_digest(dir), first);
  // A new modification time: recomputed from the bytes.
  times[1].tv_sec += 5;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_NE(weights_digest(dir), first);
  // A malformed cache is no cache.
  write(dir + "/kvoffload-fingerprint.json", "{not json");
  EXPECT_EQ(weights_digest(dir).size(), 32u);
}

TEST(Fingerprint, TheTokenizerFilesCount) {
  const std::string dir = temp_dir("tokenizer");
  const Digest none = tokenizer_digest(dir);
  write(dir + "/tokenizer.json", "{}");
  const Digest json = tokenizer_digest(dir);
  write(dir + "/tokenizer_config.json", "{}");
  const Digest both = tokenizer_digest(dir);
  EXPECT_NE(none, json);
  EXPECT_NE(json, both);
  write(dir + "/tokenizer.json", "{ }");
  EXPECT_NE(tokenizer_digest(dir), both);
}

}  // namespace
}  // namespace kvo::model
