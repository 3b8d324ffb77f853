// The synthetic generator: its presets' calibration (overlap bands measured, not assumed), the
// shape and validity of what it writes, determinism, and `hisparse-bench gen-trace`.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "bench_cmd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hisparse/trace/generate.h"
#include "hisparse/trace/locality.h"
#include "hisparse/trace/replay.h"
#include "hisparse/trace/trace.h"
#include "trace_test_util.h"

namespace hisparse::trace {
namespace trace_generate_test {

using ::hisparse::trace::testing::TempDir;
using ::testing::HasSubstr;

// Small but at the presets' calibration point, k / context = 1/16.
GeneratorOptions Small(const std::string& preset, int32_t layers = 4) {
  GeneratorOptions o;
  o.preset = *FindPreset(preset);
  o.seed = 3;
  o.requests = 2;
  o.layers = layers;
  o.steps = 48;
  o.context = 4096;
  o.k = 256;
  return o;
}

std::vector<TraceRecord> Generate(const GeneratorOptions& o) {
  std::vector<TraceRecord> recs;
  const absl::Status s = GenerateTrace(o, [&](const TraceRecord& r) {
    recs.push_back(r);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return recs;
}

LocalityStats Measure(const GeneratorOptions& o) {
  LocalityMeter meter(o.layers);
  for (const TraceRecord& r : Generate(o)) meter.Add(r);
  return meter.Finish();
}

TEST(TraceGenerateTest, Dsv32Calibration) {
  const GeneratorOptions o = Small("dsv32", 5);
  const LocalityStats s = Measure(o);
  const double random_floor = static_cast<double>(o.k) / o.context;
  for (int32_t l : {0, 1}) {  // near random: DeepSeek-V3.2 layers 0-1
    EXPECT_LT(s.consecutive[l].mean(), 0.15) << "layer " << l;
    EXPECT_LT(s.consecutive[l].mean(), 1.5 * random_floor) << "layer " << l;
  }
  for (int32_t l = 2; l < o.layers; ++l) {  // middle layers: 35-50% in DeepSeek-V3.2
    EXPECT_GE(s.consecutive[l].mean(), 0.35) << "layer " << l;
    EXPECT_LE(s.consecutive[l].mean(), 0.55) << "layer " << l;
  }
  for (int32_t l = 2; l + 1 < o.layers; ++l) {
    EXPECT_GE(s.adjacent[l].mean(), 0.7) << "layers " << l << ", " << l + 1;
    EXPECT_LE(s.adjacent[l].mean(), 1.0);
  }
}

TEST(TraceGenerateTest, StressCalibration) {
  const LocalityStats s = Measure(Small("stress"));
  for (int32_t l = 0; l < 4; ++l) {
    EXPECT_GE(s.consecutive[l].mean(), 0.12) << "layer " << l;
    EXPECT_LE(s.consecutive[l].mean(), 0.30) << "layer " << l;
  }
}

TEST(TraceGenerateTest, LocalCalibration) {
  const LocalityStats s = Measure(Small("local"));
  for (int32_t l = 0; l < 4; ++l) {  // the small trained model of FACTS.md: 0.59-0.91
    EXPECT_GE(s.consecutive[l].mean(), 0.6) << "layer " << l;
    EXPECT_LE(s.consecutive[l].mean(), 0.9) << "layer " << l;
  }
}

TEST(TraceGenerateTest, RecordsAreValidAndShaped) {
  for (const std::string& preset : PresetNames()) {
    const GeneratorOptions o = Small(preset);
    const TraceHeader h = GeneratedHeader(o);
    TraceChecker checker(h);
    const std::vector<TraceRecord> recs = Generate(o);
    ASSERT_EQ(recs.size(), static_cast<size_t>(o.steps) * o.requests * o.layers);
    const GeneratorPreset& p = o.preset;
    for (size_t i = 0; i < recs.size(); ++i) {
      const TraceRecord& r = recs[i];
      ASSERT_TRUE(checker.Check(r).ok()) << preset << " record " << i;
      EXPECT_EQ(r.seq_len, o.context + r.step);  // one token a step
      ASSERT_EQ(r.positions.size(), static_cast<size_t>(o.k));
      EXPECT_TRUE(std::is_sorted(r.positions.begin(), r.positions.end()));
      EXPECT_EQ(r.positions.back(), r.seq_len - 1);  // the newest token is always selected
      const LayerProfile& prof = r.layer < p.first_layers ? p.shallow : p.deep;
      if (prof.sinks) {
        EXPECT_EQ(r.positions[p.sink_tokens - 1], p.sink_tokens - 1);
      }
      if (prof.recency) {  // the window scales with k: 32 tokens at k = 2048
        const int32_t w = p.recency_window * o.k / 2048;
        EXPECT_EQ(r.positions[o.k - w - 1], r.seq_len - w - 1);
      }
    }
  }
}

TEST(TraceGenerateTest, ShortContextSelectsEverything) {
  GeneratorOptions o = Small("dsv32");
  o.context = 100;
  o.steps = 200;  // crosses seq_len = k = 256 at step 156
  for (const TraceRecord& r : Generate(o)) {
    ASSERT_EQ(r.positions.size(), static_cast<size_t>(std::min(r.seq_len, o.k)));
  }
}

TEST(TraceGenerateTest, SeedDeterminesTheTrace) {
  GeneratorOptions o = Small("stress");
  o.steps = 4;
  const std::vector<TraceRecord> a = Generate(o), b = Generate(o);
  o.seed = 4;
  const std::vector<TraceRecord> c = Generate(o);
  ASSERT_EQ(a.size(), b.size());
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].positions, b[i].positions);
    differs |= a[i].positions != c[i].positions;
  }
  EXPECT_TRUE(differs);
}

TEST(TraceGenerateTest, BadOptions) {
  GeneratorOptions o = Small("local");
  o.k = 0;
  EXPECT_EQ(GenerateTrace(o, [](const TraceRecord&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindPreset("dsv4").status().code(), absl::StatusCode::kInvalidArgument);
  // emit's error stops generation and comes back.
  o.k = 8;
  int calls = 0;
  EXPECT_EQ(GenerateTrace(
                o, [&](const TraceRecord&) { return ++calls == 3 ? absl::DataLossError("disk") : absl::OkStatus(); })
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(calls, 3);
}

int RunGen(std::vector<std::string> args, std::string* out) {
  return testing::RunCommand(bench::GenTraceMain, "gen-trace", std::move(args), out);
}

TEST(TraceGenerateTest, Command) {
  TempDir dir;
  const std::string path = dir.Path("t.trace.gz");
  std::string out;
  ASSERT_EQ(0, RunGen({"--preset", "dsv32", "--seed", "9", "--requests", "2", "--layers", "3", "--steps", "5",
                       "--context", "512", "--k=32", "--out", path, "--measure", "--json"},
                      &out));
  EXPECT_THAT(out, HasSubstr("\"preset\": \"dsv32\""));
  EXPECT_THAT(out, HasSubstr("\"consecutive\": ["));
  auto r = ReplayTrace(path, ReplayOptions{64, Policy::kLru, 0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->records, 2u * 3 * 5);
  EXPECT_EQ(r->k, 32);
  auto reader = TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  bool found = false;
  for (const auto& [key, value] : (*reader)->header().extra) {
    found |= key == "generator" && value.find("--preset dsv32 --seed 9") != std::string::npos;
  }
  EXPECT_TRUE(found);

  EXPECT_EQ(
      0,
      RunGen({"--preset", "local", "--steps", "2", "--context", "64", "--k", "8", "--layers", "1", "--measure"}, &out));
  EXPECT_THAT(out, HasSubstr("consecutive-step overlap per layer"));
  EXPECT_EQ(2, RunGen({"--steps", "2", "--measure"}, &out));                   // no preset
  EXPECT_EQ(2, RunGen({"--preset", "foo", "--measure"}, &out));                // unknown preset
  EXPECT_EQ(2, RunGen({"--preset", "local"}, &out));                           // no output
  EXPECT_EQ(2, RunGen({"--preset", "local", "--k", "0", "--measure"}, &out));  // bad k
  EXPECT_EQ(2, RunGen({"--preset", "local", "--bogus", "1", "--measure"}, &out));
  EXPECT_EQ(1, RunGen({"--preset", "local", "--steps", "1", "--context", "8", "--k", "2", "--out",
                       dir.Path("no/such/dir/t.gz")},
                      &out));
}

// --hints H writes a version-2 trace whose records carry H hints and whose selections are those
// of the same command without hints.
TEST(TraceGenerateTest, CommandWritesHints) {
  TempDir dir;
  const std::string plain = dir.Path("plain.trace"), hinted = dir.Path("hinted.trace.gz");
  const std::vector<std::string> base = {"--preset", "stress", "--requests", "1",   "--layers", "2",
                                         "--steps",  "4",      "--context",  "256", "--k",      "16"};
  std::string out;
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--out", plain});
  ASSERT_EQ(0, RunGen(args, &out));
  args = base;
  args.insert(args.end(), {"--hints", "16", "--out", hinted});
  ASSERT_EQ(0, RunGen(args, &out));
  auto a = TraceReader::Open(plain);
  auto b = TraceReader::Open(hinted);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->header().hints, 0);
  EXPECT_EQ((*b)->header().hints, 16);
  TraceRecord ra, rb;
  int records = 0;
  while (true) {
    absl::StatusOr<bool> more = (*a)->Next(&ra);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    absl::StatusOr<bool> more_b = (*b)->Next(&rb);
    ASSERT_TRUE(more_b.ok() && *more_b);
    EXPECT_EQ(ra.positions, rb.positions);
    EXPECT_TRUE(ra.hints.empty());
    EXPECT_EQ(rb.hints.size(), 16u);
    ++records;
  }
  EXPECT_EQ(records, 8);
  EXPECT_EQ(2, RunGen({"--preset", "local", "--hints", "-1", "--measure"}, &out));
}

}  // namespace trace_generate_test
}  // namespace hisparse::trace
