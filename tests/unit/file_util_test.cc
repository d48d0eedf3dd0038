// Token files: the client's (its first line) and the server's accepted list
// (every line, for rotation); both refuse loose permissions and never echo
// a token.
#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>

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

}  // namespace
}  // namespace shardline
