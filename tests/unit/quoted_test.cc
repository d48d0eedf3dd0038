// What error messages and listings do with text from outside (common/base/quoted.h).
#include "common/base/quoted.h"

#include <string>

#include "gtest/gtest.h"

namespace shardline {
namespace {

// A path, host or log line is shown as itself when it is printable text in
// any script, and nothing in it can act on a terminal.
TEST(Printable, KeepsTextInAnyScriptAndEscapesWhatATerminalActsOn) {
  EXPECT_EQ(Printable("/data/ckpt/job-1"), "/data/ckpt/job-1");
  EXPECT_EQ(Printable("/data/Überprüfung/数据"), "/data/Überprüfung/数据");
  EXPECT_TRUE(IsPrintable("/data/Überprüfung/数据"));
  // A forged row, a cleared screen, a window title (OSC) ended by BEL.
  EXPECT_EQ(Printable("a\nb\rc\x1b[2J\x1b]0;pwned\x07"), "a\\x0ab\\x0dc\\x1b[2J\\x1b]0;pwned\\x07");
  EXPECT_EQ(Printable("del\x7f"), "del\\x7f");
  // C1 controls: 0x9b is a one-byte CSI on some terminals, U+009B in UTF-8.
  EXPECT_EQ(Printable("\x9b" "2J"), "\\x9b2J");
  EXPECT_EQ(Printable("\xc2\x9b" "2J"), "\\xc2\\x9b2J");
  // Text that reverses or hides what follows it: RIGHT-TO-LEFT OVERRIDE, a
  // zero-width space, a first-strong isolate.
  EXPECT_EQ(Printable("abc\xe2\x80\xae" "fdp.exe"), "abc\\xe2\\x80\\xaefdp.exe");
  EXPECT_EQ(Printable("a\xe2\x80\x8b" "b"), "a\\xe2\\x80\\x8bb");
  EXPECT_EQ(Printable("\xe2\x81\xa8" "x"), "\\xe2\\x81\\xa8x");
  // Malformed UTF-8: a stray continuation, an overlong slash, a surrogate, a cut sequence.
  EXPECT_EQ(Printable("\x80\xc0\xaf\xed\xa0\x80\xe6\x95"), "\\x80\\xc0\\xaf\\xed\\xa0\\x80\\xe6\\x95");
  for (const char* bad : {"a\nb", "\x1b", "\xc2\x85", "\xe2\x80\xae", "\xff"}) EXPECT_FALSE(IsPrintable(bad)) << bad;
  EXPECT_TRUE(IsPrintable(""));
}

// Cut on a character boundary, never inside one, and said to be cut.
TEST(Printable, CutsOnACharacterBoundary) {
  EXPECT_EQ(Printable(std::string(5000, 'x'), 1024), std::string(1024, 'x') + "...");
  EXPECT_EQ(Printable("ab数据", 4), "ab...");  // 数 is 3 bytes: it would pass 4
  EXPECT_EQ(Printable("ab数据", 5), "ab数...");
  EXPECT_EQ(Printable("abc", 3), "abc");
}

}  // namespace
}  // namespace shardline
