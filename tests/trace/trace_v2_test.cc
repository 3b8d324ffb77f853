// Trace format version 2 (retention hints): the reader takes version 1 and 2, the writer writes
// version 2 exactly when its header has hints, and every malformed hint is rejected with its line.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/generate.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_v2_test {

using ::hisparse::trace::testing::ReadAll;
using ::hisparse::trace::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kValidV2[] =
    "hisparse-trace 2\n"
    "k 3\n"
    "layers 2\n"
    "hints 4\n"
    "model tiny\n"
    "S 0 0 7 5 4 0\n"
    "H 0 0 7 3 1 2\n"
    "S 0 1 7 5 1\n"
    "# a comment between a record's S and H lines\n"
    "H 0 1 7 0\n"
    "S 1 0 7 6 5 2\n"  // no hints
    "S 1 1 9 2 0\n"
    "H 1 1 9 1";  // the last line, no final newline

// The status of reading `text` to its end or first error.
absl::Status ReadStatus(const TempDir& dir, const std::string& text) {
  const std::string path = dir.Write("t.trace", text);
  auto reader = TraceReader::Open(path);
  if (!reader.ok()) return reader.status();
  TraceRecord r;
  while (true) {
    auto more = (*reader)->Next(&r);
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();
  }
}

TEST(TraceV2Test, ReadsHintsPlainAndGzip) {
  TempDir dir;
  for (const char* name : {"v2.trace", "v2.trace.gz"}) {
    TraceHeader h;
    const std::vector<TraceRecord> recs = ReadAll(dir.Write(name, kValidV2), &h);
    EXPECT_EQ(h.k, 3);
    EXPECT_EQ(h.hints, 4);
    ASSERT_EQ(h.extra.size(), 1u);  // `hints` is the format's key, not an extra one
    ASSERT_EQ(recs.size(), 4u);
    EXPECT_THAT(recs[0].positions, ElementsAre(4, 0));
    EXPECT_THAT(recs[0].hints, ElementsAre(3, 1, 2));  // rank order kept
    EXPECT_THAT(recs[1].hints, ElementsAre(0));
    EXPECT_THAT(recs[2].hints, IsEmpty());
    EXPECT_EQ(recs[3].request, 9);
    EXPECT_THAT(recs[3].hints, ElementsAre(1));
  }
}

TEST(TraceV2Test, RejectsMalformedHintsWithLineNumber) {
  TempDir dir;
  const std::string v2 = "hisparse-trace 2\nk 2\nlayers 1\nhints 2\n";  // lines 1-4
  const std::string v1 = "hisparse-trace 1\nk 2\nlayers 1\n";
  struct Case {
    std::string name, text;
    int line;
    std::string what;
  };
  const std::vector<Case> cases = {
      {"hints zero", "hisparse-trace 2\nk 2\nlayers 1\nhints 0\n", 4, "positive integer"},
      {"H line in v1", v1 + "S 0 0 0 5 1\nH 0 0 0 2\n", 5, "H line in a version-1 trace"},
      {"H before any S", v2 + "H 0 0 0 2\n", 5, "H line before any S line"},
      {"H after H", v2 + "S 0 0 0 5 1\nH 0 0 0 2\nH 0 0 0 3\n", 7, "without the S line of its record"},
      {"H of another record", v2 + "S 0 0 0 5 1\nH 0 0 1 2\n", 6, "does not follow the S line"},
      {"H with no hints", v2 + "S 0 0 0 5 1\nH 0 0 0\n", 6, "H line needs"},
      {"hint selected", v2 + "S 0 0 0 5 1\nH 0 0 0 2 1\n", 6, "hint 1 is also selected"},
      {"hint twice", v2 + "S 0 0 0 5 1\nH 0 0 0 2 2\n", 6, "hint 2 given twice"},
      {"hint = seq_len", v2 + "S 0 0 0 5 1\nH 0 0 0 5\n", 6, "hint 5 outside [0, seq_len = 5)"},
      {"hint negative", v2 + "S 0 0 0 5 1\nH 0 0 0 -1\n", 6, "hint -1 outside"},
      {"more than h", v2 + "S 0 0 0 5 1\nH 0 0 0 2 3 4\n", 6, "3 hints, more than hints = 2"},
      {"hint text", v2 + "S 0 0 0 5 1\nH 0 0 0 2x\n", 6, "hint '2x'"},
      {"bad S before lookahead", v2 + "S 0 0 0 5 7\nH 0 0 0 2\n", 5, "position 7 outside"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ReadStatus(dir, c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(":" + std::to_string(c.line) + ": ")) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.what)) << c.name << ": " << s;
  }
}

// The shared format (TRACE_FORMAT.md): readers ignore header keys they do not know, and version 2
// sets no bound on a record's hints; `hints h` is this implementation's optional bound.
TEST(TraceV2Test, HintsKeyIsOptionalInV2AndUnknownInV1) {
  TempDir dir;
  TraceHeader h;
  std::vector<TraceRecord> recs =
      ReadAll(dir.Write("nokey.trace", "hisparse-trace 2\nk 2\nlayers 1\nS 0 0 0 9 1\nH 0 0 0 2 3 4 5\n"), &h);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_THAT(recs[0].hints, ElementsAre(2, 3, 4, 5));
  EXPECT_GE(h.hints, 4);
  recs = ReadAll(dir.Write("v1key.trace", "hisparse-trace 1\nk 2\nlayers 1\nhints 2\nS 0 0 0 5 1\n"), &h);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(h.hints, 0);
  EXPECT_TRUE(h.extra.empty());  // ignored, not kept: a writer of this header must accept it
  EXPECT_EQ(ReadStatus(dir, "hisparse-trace 1\nk 2\nlayers 1\nhints 2\nS 0 0 0 5 1\nH 0 0 0 2\n").code(),
            absl::StatusCode::kInvalidArgument);  // still no H lines in version 1
}

TEST(TraceV2Test, WriterWritesVersion2OnlyWithHints) {
  TempDir dir;
  const std::string p1 = dir.Path("v1.trace"), p2 = dir.Path("v2.trace.gz");
  {
    auto w = TraceWriter::Create(p1, TraceHeader{2, 1, 0, {}});
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE((*w)->Write({0, 0, 0, 5, {1}, {}}).ok());
    const absl::Status s = (*w)->Write({1, 0, 0, 6, {1}, {2}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);  // hints in a version-1 trace
    EXPECT_THAT(std::string(s.message()), HasSubstr("version-1"));
    ASSERT_TRUE((*w)->Close().ok());
  }
  TraceHeader h;
  EXPECT_EQ(ReadAll(p1, &h).size(), 1u);
  EXPECT_EQ(h.hints, 0);
  {
    auto w = TraceWriter::Create(p2, TraceHeader{2, 2, 3, {{"model", "m"}}});
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE((*w)->Write({0, 0, 0, 9, {1, 8}, {7, 2, 0}}).ok());
    EXPECT_TRUE((*w)->Write({0, 1, 0, 9, {1}, {}}).ok());
    EXPECT_FALSE((*w)->Write({1, 0, 0, 9, {1}, {1}}).ok());           // hint selected
    EXPECT_FALSE((*w)->Write({1, 0, 0, 9, {1}, {2, 3, 4, 5}}).ok());  // more than hints = 3
    EXPECT_FALSE((*w)->Write({1, 0, 0, 9, {1}, {9}}).ok());           // hint >= seq_len
    EXPECT_TRUE((*w)->Write({1, 0, 0, 10, {1}, {9}}).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  const std::vector<TraceRecord> recs = ReadAll(p2, &h);
  EXPECT_EQ(h.hints, 3);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_THAT(recs[0].hints, ElementsAre(7, 2, 0));
  EXPECT_THAT(recs[1].hints, IsEmpty());
  EXPECT_THAT(recs[2].hints, ElementsAre(9));
  EXPECT_FALSE(TraceWriter::Create(dir.Path("x"), TraceHeader{2, 1, -1, {}}).ok());
  EXPECT_FALSE(TraceWriter::Create(dir.Path("x"), TraceHeader{2, 1, 0, {{"hints", "3"}}}).ok());
}

// The generator's hints are its own next-best candidates: never selected, best first, and far
// likelier than a random unselected position to be selected at the next step (in dsv32's deep
// layers; its first two select at random, so nothing predicts their next step). Its selections
// are the same with and without hints.
TEST(TraceV2Test, GeneratorHintsAreTheNextBestCandidates) {
  GeneratorOptions o;
  o.preset = *FindPreset("dsv32");
  o.requests = 2;
  o.layers = 4;
  o.steps = 24;
  o.context = 2048;
  o.k = 128;
  std::vector<TraceRecord> plain, hinted;
  ASSERT_TRUE(GenerateTrace(o, [&](const TraceRecord& r) {
                plain.push_back(r);
                return absl::OkStatus();
              }).ok());
  o.hints = 128;
  EXPECT_EQ(GeneratedHeader(o).hints, 128);
  TraceChecker checker(GeneratedHeader(o));
  ASSERT_TRUE(GenerateTrace(o, [&](const TraceRecord& r) {
                hinted.push_back(r);
                return checker.Check(r);
              }).ok());
  ASSERT_EQ(plain.size(), hinted.size());
  // Next-step selection rate of the hinted positions against that of all unselected ones.
  uint64_t hinted_next = 0, hinted_total = 0, other_next = 0, other_total = 0;
  const size_t per_step = static_cast<size_t>(o.requests) * o.layers;
  for (size_t i = 0; i < hinted.size(); ++i) {
    EXPECT_EQ(hinted[i].positions, plain[i].positions) << "record " << i;
    EXPECT_TRUE(plain[i].hints.empty());
    EXPECT_EQ(hinted[i].hints.size(), 128u);  // seq_len - forced - k candidates are far more
    if (i + per_step >= hinted.size() || hinted[i].layer < o.preset.first_layers) continue;
    const TraceRecord& next = hinted[i + per_step];  // same (request, layer), next step
    std::vector<char> sel_next(next.seq_len, 0), sel_now(next.seq_len, 0);
    for (int32_t p : next.positions) sel_next[p] = 1;
    for (int32_t p : hinted[i].positions) sel_now[p] = 1;
    for (int32_t p : hinted[i].hints) hinted_next += sel_next[p], ++hinted_total;
    for (int32_t p = 0; p < hinted[i].seq_len; ++p) {
      if (!sel_now[p]) other_next += sel_next[p], ++other_total;
    }
  }
  const double hinted_rate = static_cast<double>(hinted_next) / hinted_total;
  const double other_rate = static_cast<double>(other_next) / other_total;
  EXPECT_GT(hinted_rate, 3 * other_rate) << hinted_rate << " vs " << other_rate;
  o.hints = -1;
  EXPECT_EQ(GenerateTrace(o, [](const TraceRecord&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace trace_v2_test
}  // namespace hisparse::trace
