// Token files: the client's (its first line) and the server's accepted list
// (every line, for rotation); both refuse loose permissions and never echo
// a token.
#include "common/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/model/safetensors.h"

namespace shardline {
namespace {

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode = 0600) {
  const std::string path = ::testing::TempDir() + "/" + name;
  ::unlink(path.c_str());
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(TokenFileTest, AClientSendsTheFirstLineTrimmed) {
  EXPECT_EQ(*ReadTokenFile(WriteFile("t1", "  s3cret \nsecond\n")), "s3cret");
  absl::Status empty = ReadTokenFile(WriteFile("t2", "\n")).status();
  EXPECT_NE(empty.message().find("token file is empty"), std::string::npos) << empty;
}

TEST(TokenFileTest, AServerAcceptsEveryTokenLineSoThatTokensRotate) {
  auto tokens = ReadAcceptedTokens(WriteFile("t3", "# rotated 2026-11-22\nnew-token\n\n  old-token  \n"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"new-token", "old-token"}));
  EXPECT_NE(ReadAcceptedTokens(WriteFile("t4", "# nothing\n\n")).status().message().find("holds no token"),
            std::string::npos);
  std::string many;
  for (int i = 0; i <= kMaxAcceptedTokens; ++i) many += "t" + std::to_string(i) + "\n";
  EXPECT_NE(ReadAcceptedTokens(WriteFile("t5", many)).status().message().find("more than 16 tokens"),
            std::string::npos);
}

TEST(TokenFileTest, LooseFilesAndInvisibleCharactersAreRefusedWithoutEchoingTheToken) {
  absl::Status loose = ReadAcceptedTokens(WriteFile("t6", "secret-a\n", 0644)).status();
  EXPECT_EQ(loose.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(loose.message().find("permissions 0644 are too open"), std::string::npos) << loose;
  absl::Status bad = ReadAcceptedTokens(WriteFile("t7", "good\nsecret b\n")).status();
  EXPECT_NE(bad.message().find("t7:2: the token holds a character"), std::string::npos) << bad;
  EXPECT_EQ(bad.message().find("secret"), std::string::npos) << bad;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A folder of its own under the test's temp dir, emptied first.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Links planted where a program writes (issue 24): under the temp file's
// name, under the final name, and as the folder itself. None is written
// through; the victim's file keeps its bytes.
TEST(AtomicWrites, PlantedSymlinksAreNeverWrittenThrough) {
  const std::string victim_dir = FreshDir("victim"), mine = FreshDir("mine");
  const std::string victim = victim_dir + "/committed";
  std::ofstream(victim) << "the victim's bytes";
  // A link at "<name>.tmp" and one at the name itself.
  std::filesystem::create_symlink(victim, mine + "/config.json.tmp");
  std::filesystem::create_symlink(victim, mine + "/model.safetensors");
  ASSERT_TRUE(WriteFileAtomically(mine + "/config.json", "{}\n").ok());
  EXPECT_EQ(Slurp(mine + "/config.json"), "{}\n");
  auto w = SafetensorsStreamWriter::Create(mine + "/model.safetensors", {{"w", {2}}});
  ASSERT_TRUE(w.ok()) << w.status();
  const float data[2] = {1, 2};
  ASSERT_TRUE((*w)->Append(data, 2).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_FALSE(std::filesystem::is_symlink(mine + "/model.safetensors"));  // replaced, not followed
  EXPECT_EQ(Slurp(victim), "the victim's bytes");
  // The folder itself a link to the victim's: refused, naming it.
  std::filesystem::create_symlink(victim_dir, mine + "/out");
  absl::Status s = WriteFileAtomically(mine + "/out/config.json", "{}\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(mine + "/out: is a symlink"), std::string::npos) << s;
  EXPECT_FALSE(SafetensorsStreamWriter::Create(mine + "/out/model.safetensors", {{"w", {2}}}).ok());
  EXPECT_FALSE(std::filesystem::exists(victim_dir + "/config.json"));
  EXPECT_FALSE(std::filesystem::exists(victim_dir + "/model.safetensors.tmp"));
  EXPECT_EQ(Slurp(victim), "the victim's bytes");
}

// What a user names as a file the coordinator reads (config.json, an index)
// may be a FIFO or a device: refused at once, never waited on or read whole.
TEST(ReadFile, OnlyBoundedRegularFilesAreRead) {
  const std::string dir = FreshDir("read-file");
  const std::string fifo = dir + "/config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> r = ReadFileToString(fifo, "[model] hf_dir config");  // returns: no writer waited for
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("is not a regular file"), std::string::npos) << r.status();
  EXPECT_EQ(ReadFileToString("/dev/zero", "config").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFileToString(dir, "config").status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/big") << std::string(100, 'x');
  absl::Status big = ReadFileToString(dir + "/big", "index", 64).status();
  EXPECT_NE(big.message().find("holds 100 bytes, more than the 64 allowed"), std::string::npos) << big;
  EXPECT_EQ(*ReadFileToString(dir + "/big", "index", 100), std::string(100, 'x'));
  EXPECT_EQ(ReadFileToString(dir + "/absent", "index").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardline
