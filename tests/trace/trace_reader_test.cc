// The version-1 trace reader and writer: valid traces (plain and gzip) and every malformed case,
// each rejected with the right line number.
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_reader_test {

using ::hisparse::trace::testing::ReadAll;
using ::hisparse::trace::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kValid[] =
    "# a comment before the header\n"
    "hisparse-trace 1\n"
    "k 3\n"
    "layers 2\n"
    "model tiny-test  v1\n"
    "\n"
    "S 0 0 7 5 4 0\n"
    "S 0 1 7 5\n"
    "# comment between records\n"
    "S 0 0 9 3 2 1 0\n"
    "S 2 0 7 6\t5  1 \r\n"
    "S 2 1 9 4 0";  // no final newline

void ExpectValidContent(const std::string& path) {
  TraceHeader h;
  const std::vector<TraceRecord> recs = ReadAll(path, &h);
  EXPECT_EQ(h.k, 3);
  EXPECT_EQ(h.layers, 2);
  ASSERT_EQ(h.extra.size(), 1u);
  EXPECT_EQ(h.extra[0].first, "model");
  EXPECT_EQ(h.extra[0].second, "tiny-test  v1");
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].step, 0);
  EXPECT_EQ(recs[0].request, 7);
  EXPECT_EQ(recs[0].seq_len, 5);
  EXPECT_THAT(recs[0].positions, ElementsAre(4, 0));
  EXPECT_TRUE(recs[1].positions.empty());
  EXPECT_THAT(recs[2].positions, ElementsAre(2, 1, 0));
  EXPECT_EQ(recs[3].step, 2);
  EXPECT_THAT(recs[3].positions, ElementsAre(5, 1));
  EXPECT_EQ(recs[4].layer, 1);
  EXPECT_THAT(recs[4].positions, ElementsAre(0));
}

TEST(TraceReaderTest, ReadsPlainAndGzip) {
  TempDir dir;
  ExpectValidContent(dir.Write("t.trace", kValid));
  ExpectValidContent(dir.Write("t.trace.gz", kValid));
  ExpectValidContent(dir.Write("gz-without-suffix", kValid));  // plain, whatever the name
}

TEST(TraceReaderTest, LongLinesAndEmptyTrace) {
  TempDir dir;
  std::string text = "hisparse-trace 1\nk 5000\nlayers 1\nS 0 0 0 100000";
  for (int p = 0; p < 5000; ++p) text += " " + std::to_string(p * 17);
  text += "\n";
  TraceHeader h;
  for (const char* name : {"long.trace", "long.trace.gz"}) {
    auto recs = ReadAll(dir.Write(name, text), &h);
    ASSERT_EQ(recs.size(), 1u);
    EXPECT_EQ(recs[0].positions.size(), 5000u);
    EXPECT_EQ(recs[0].positions.back(), 4999 * 17);
  }
  EXPECT_TRUE(ReadAll(dir.Write("empty.trace", "hisparse-trace 1\nk 1\nlayers 1\n"), &h).empty());
}

struct BadCase {
  std::string name;
  std::string text;
  int line;
  std::string what;
};

TEST(TraceReaderTest, RejectsMalformedWithLineNumber) {
  const std::string h = "hisparse-trace 1\nk 2\nlayers 2\n";  // lines 1-3
  const std::vector<BadCase> cases = {
      {"empty file", "", 1, "missing 'hisparse-trace 1'"},
      {"only comments", "# x\n# y\n", 2, "missing 'hisparse-trace 1'"},
      {"wrong magic", "hisparse-trace\n", 1, "unsupported version"},
      {"not a trace", "S 0 0 0 1\n", 1, "bad header"},
      {"version 3", "hisparse-trace 3\nk 2\n", 1, "unsupported version"},
      {"k missing", "hisparse-trace 1\nlayers 2\nS 0 0 0 5 1\n", 3, "'k' missing"},
      {"layers missing", "hisparse-trace 1\nk 2\n\nS 0 0 0 5 1\n", 4, "'layers' missing"},
      {"header only, k missing", "hisparse-trace 1\nlayers 2\n", 2, "'k' missing"},
      {"k twice", "hisparse-trace 1\nk 2\nk 3\n", 3, "given twice"},
      {"k zero", "hisparse-trace 1\nk 0\n", 2, "positive integer"},
      {"k text", "hisparse-trace 1\nk two\n", 2, "positive integer"},
      {"layers two values", "hisparse-trace 1\nk 2\nlayers 2 3\n", 3, "positive integer"},
      {"step decreasing", h + "S 1 0 0 5 1\n# c\nS 0 0 0 5 2\n", 6, "steps must not decrease"},
      {"layer out of range", h + "S 0 2 0 5 1\n", 4, "layer 2 outside [0, 2)"},
      {"position = seq_len", h + "S 0 0 0 5 5\n", 4, "position 5 outside [0, seq_len = 5)"},
      {"negative position", h + "S 0 0 0 5 -1\n", 4, "position -1 outside"},
      {"duplicate", h + "S 0 0 0 5 1 3\nS 0 1 0 5 3 3\n", 5, "position 3 selected twice"},
      {"more than k", h + "S 0 0 0 5 1 2 3\n", 4, "3 positions, more than k = 2"},
      {"pair twice", h + "S 0 0 7 5 1\nS 0 1 7 5 1\nS 0 0 7 6 2\n", 6, "(layer 0, request 7) appears twice in step 0"},
      {"step text", h + "S x 0 0 5 1\n", 4, "step 'x'"},
      {"layer text", h + "S 0 0.5 0 5 1\n", 4, "layer '0.5'"},
      {"request negative", h + "S 0 0 -3 5 1\n", 4, "request '-3'"},
      {"seq_len zero", h + "S 0 0 0 0\n", 4, "seq_len '0'"},
      {"position text", h + "S 0 0 0 5 1a\n", 4, "position '1a'"},
      {"position plus", h + "S 0 0 0 5 +1\n", 4, "position '+1'"},
      {"huge number", h + "S 99999999999999999999 0 0 5 1\n", 4, "step '"},
      {"short S line", h + "S 0 0 0\n", 4, "S line needs"},
      {"header key after S", h + "S 0 0 0 5 1\nmodel x\n", 5, "expected an S line"},
      {"lowercase s", h + "S 0 0 0 5 1\ns 1 0 0 5 1\n", 5, "expected an S line"},
      {"NUL byte", h + std::string("S 0 0 0 5 1\0", 12) + "\n", 4, "NUL byte"},
  };
  TempDir dir;
  for (const BadCase& c : cases) {
    for (const char* suffix : {"", ".gz"}) {
      const std::string path = dir.Write("bad" + std::string(suffix), c.text);
      auto reader = TraceReader::Open(path);
      absl::Status status = reader.status();
      if (reader.ok()) {
        TraceRecord r;
        while (true) {
          auto more = (*reader)->Next(&r);
          if (!more.ok()) {
            status = more.status();
            break;
          }
          if (!*more) break;
        }
      }
      ASSERT_FALSE(status.ok()) << c.name << ": accepted";
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_THAT(std::string(status.message()), HasSubstr(path + ":" + std::to_string(c.line) + ": "))
          << c.name << ": " << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(c.what)) << c.name << ": " << status;
    }
  }
}

TEST(TraceReaderTest, MissingFileAndTruncatedGzip) {
  TempDir dir;
  EXPECT_EQ(TraceReader::Open(dir.Path("nope")).status().code(), absl::StatusCode::kNotFound);
  std::string big = "hisparse-trace 1\nk 4\nlayers 1\n";
  for (int s = 0; s < 4000; ++s) big += "S " + std::to_string(s) + " 0 1 100 3 1 4 9\n";
  const std::string full = dir.Write("full.gz", big);
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir.Path("cut.gz"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto reader = TraceReader::Open(dir.Path("cut.gz"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  TraceRecord r;
  absl::StatusOr<bool> more = true;
  while (more.ok() && *more) more = (*reader)->Next(&r);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("truncated gzip"));
  EXPECT_GT((*reader)->line(), 100);  // reported where the good data ends
}

TEST(TraceWriterTest, RoundTripsAndRefusesBadRecords) {
  TempDir dir;
  TraceHeader h;
  h.k = 3;
  h.layers = 2;
  h.extra = {{"source", "unit test"}};
  for (const char* name : {"w.trace", "w.trace.gz"}) {
    auto w = TraceWriter::Create(dir.Path(name), h);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Write({0, 0, 4, 10, {9, 2, 5}, {}}).ok());
    EXPECT_TRUE((*w)->Write({0, 1, 4, 10, {}, {}}).ok());
    EXPECT_FALSE((*w)->Write({0, 1, 4, 10, {1}, {}}).ok());     // pair twice in step 0
    EXPECT_FALSE((*w)->Write({1, 0, 4, 10, {1, 1}, {}}).ok());  // duplicate
    EXPECT_FALSE((*w)->Write({1, 2, 4, 10, {1}, {}}).ok());     // layer
    EXPECT_FALSE((*w)->Write({1, 0, 4, 10, {10}, {}}).ok());    // position
    EXPECT_FALSE((*w)->Write({1, 0, 4, 10, {1, 2, 3, 4}, {}}).ok());
    EXPECT_TRUE((*w)->Write({3, 0, 4, 11, {10}, {}}).ok());
    EXPECT_FALSE((*w)->Write({2, 0, 5, 11, {10}, {}}).ok());  // step decreasing
    ASSERT_TRUE((*w)->Close().ok());
    TraceHeader got;
    auto recs = ReadAll(dir.Path(name), &got);
    EXPECT_EQ(got.k, 3);
    ASSERT_EQ(got.extra.size(), 1u);
    EXPECT_EQ(got.extra[0].second, "unit test");
    ASSERT_EQ(recs.size(), 3u);
    EXPECT_THAT(recs[0].positions, ElementsAre(9, 2, 5));
    EXPECT_EQ(recs[2].step, 3);
  }
  h.k = 0;
  EXPECT_FALSE(TraceWriter::Create(dir.Path("x"), h).ok());
}

}  // namespace trace_reader_test
}  // namespace hisparse::trace
