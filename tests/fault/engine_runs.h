// What the fault tests that drive hisparse-durable-engine share (durable_restart_test: an engine
// dies; daemon_restart_test: the daemon does): where the binaries are, the engine's output lines,
// and bounded waits. Header-only.
#ifndef HISPARSE_TESTS_FAULT_ENGINE_RUNS_H_
#define HISPARSE_TESTS_FAULT_ENGINE_RUNS_H_

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "hisparse/common/daemon_process.h"

namespace hisparse::fault {

// The build's bin/: the daemon, the keeper, the engine and hisparse-ctl beside the test.
inline std::string BinDir() { return ExecutableDir(); }

// An engine's output file, one line each.
inline std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// "STEP LAYER SLOT... HASH EXACT" -> its hash: the gathered records' FNV-1a.
inline std::string HashOf(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> f;
  for (std::string w; in >> w;) f.push_back(w);
  return f.size() >= 2 ? f[f.size() - 2] : "";
}

// The lines of a decode that an engine's death or the daemon's split at step `cut_step`, checked
// against the uninterrupted runs of the same engine (2 layers, a line per step and layer):
// `before` (up to the cut) equals the plain run `straight`; `after` (an adopter's, from the cut)
// equals, slots and bytes, the run `parked` that parked and resumed at the cut (what adoption does
// to the row), gathers the same bytes as `straight`, and every record it gathered is the one
// stored at its position.
inline void ExpectAdoptedRunExact(const std::vector<std::string>& straight, const std::vector<std::string>& parked,
                                  const std::vector<std::string>& before, const std::vector<std::string>& after,
                                  int steps, int cut_step) {
  const size_t layers = 2, cut = static_cast<size_t>(cut_step) * layers;
  ASSERT_EQ(straight.size(), static_cast<size_t>(steps) * layers);
  ASSERT_EQ(parked.size(), straight.size());
  ASSERT_EQ(before.size(), cut);
  ASSERT_EQ(after.size(), straight.size() - cut);
  for (size_t i = 0; i < cut; ++i) EXPECT_EQ(before[i], straight[i]) << "line " << i;
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i], parked[cut + i]) << "line " << cut + i;
    EXPECT_EQ(HashOf(after[i]), HashOf(straight[cut + i])) << "line " << cut + i;
    EXPECT_EQ(after[i].back(), '1') << after[i];
  }
  for (const std::string& line : straight) EXPECT_EQ(line.back(), '1') << line;
}

// Polls (bounded: 60 s) for what the daemon does after a peer died; nothing is asserted about
// timing.
template <typename Done>
bool WaitUntil(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace hisparse::fault

#endif  // HISPARSE_TESTS_FAULT_ENGINE_RUNS_H_
