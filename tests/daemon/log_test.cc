// Logging: the text and JSON shapes, journald's priority prefix, and when stderr counts as the
// journal. Each case captures this process's stderr in a temporary file.
#include "hisparse/common/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/common/unique_fd.h"

namespace hisparse {
namespace log_test {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

// What `body` writes to stderr, with `options` set for its duration.
template <typename Body>
std::string Captured(const LogOptions& options, Body body) {
  char path[] = "/tmp/hisparse-log-XXXXXX";
  UniqueFd file(::mkstemp(path));
  std::fflush(stderr);
  UniqueFd saved(::dup(2));
  ::dup2(file.get(), 2);
  SetLogOptions(options);
  body();
  SetLogOptions(LogOptions{});
  ::dup2(saved.get(), 2);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  return text.str();
}

TEST(LogTest, TextLine) {
  const std::string out = Captured(LogOptions{}, [] { LOG(WARNING) << "pool " << 3; });
  EXPECT_THAT(out, MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{6}Z W [^ ]+\\[[0-9]+\\] "
                                "log_test\\.cc:[0-9]+\\] pool 3\n"));
}

TEST(LogTest, JsonLineEscapesTheMessageAndCarriesTheNode) {
  LogOptions o;
  o.format = LogFormat::kJson;
  o.node = "gpu-node-7";
  const std::string out = Captured(o, [] { LOG(ERROR) << "a \"quoted\" \\ path\nand a tab\t"; });
  EXPECT_THAT(out, MatchesRegex("\\{\"time\":\"[0-9T:.-]+Z\",\"level\":\"error\",\"program\":\"[^\"]+\",\"pid\":[0-9]+,"
                                "\"node\":\"gpu-node-7\",\"source\":\"log_test\\.cc:[0-9]+\",\"message\":\"a "
                                "\\\\\"quoted\\\\\" \\\\\\\\ path\\\\nand a tab\\\\t\"\\}\n"));
  o.node.clear();
  EXPECT_THAT(Captured(o, [] { LOG(INFO) << "x"; }), Not(HasSubstr("\"node\"")));
}

TEST(LogTest, PriorityPrefixForJournald) {
  LogOptions o;
  o.priority_prefix = true;
  SetLogThreshold(LogSeverity::kDebug);
  const std::string out = Captured(o, [] {
    LOG(ERROR) << "e";
    LOG(WARNING) << "w";
    LOG(INFO) << "i";
    LOG(DEBUG) << "d";
  });
  SetLogThreshold(LogSeverity::kInfo);
  std::istringstream lines(out);
  std::string line;
  for (const char* want : {"<3>", "<4>", "<6>", "<7>"}) {
    ASSERT_TRUE(std::getline(lines, line)) << out;
    EXPECT_THAT(line, StartsWith(want)) << out;
  }
  o.format = LogFormat::kJson;
  EXPECT_THAT(Captured(o, [] { LOG(INFO) << "x"; }), StartsWith("<6>{\"time\":"));
}

TEST(LogTest, StderrIsTheJournalOnlyWhenJournalStreamNamesIt) {
  char path[] = "/tmp/hisparse-journal-XXXXXX";
  UniqueFd file(::mkstemp(path));
  UniqueFd saved(::dup(2));
  ::dup2(file.get(), 2);
  struct stat st {};
  ASSERT_EQ(::fstat(2, &st), 0);
  const std::string mine = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::setenv("JOURNAL_STREAM", mine.c_str(), 1);
  const bool matches = StderrIsJournal();
  ::setenv("JOURNAL_STREAM", (std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino + 1)).c_str(), 1);
  const bool other = StderrIsJournal();
  ::setenv("JOURNAL_STREAM", "garbage", 1);
  const bool garbage = StderrIsJournal();
  ::unsetenv("JOURNAL_STREAM");
  const bool unset = StderrIsJournal();
  ::dup2(saved.get(), 2);
  ::unlink(path);
  EXPECT_TRUE(matches);
  EXPECT_FALSE(other);  // inherited from a parent whose stderr was the journal
  EXPECT_FALSE(garbage);
  EXPECT_FALSE(unset);
}

}  // namespace log_test
}  // namespace hisparse
