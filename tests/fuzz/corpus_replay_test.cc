// Corpus replay: runs a fuzz target's LLVMFuzzerTestOneInput over every file of its seed corpus,
// as a plain GoogleTest, so that the normal (gcc, no libFuzzer) build and CI's ctest run cover the
// targets and their seeds. The corpus folder comes from $HISPARSE_CORPUS_DIR, which ctest sets
// (tests/fuzz/CMakeLists.txt); nothing about the source tree is compiled in, so the binary runs
// anywhere. A target aborts on a finding, which fails the test with the file being replayed in
// the log. Beyond what the targets check themselves, the replay checks what a seed leaves behind:
// every seed runs twice, and the second run must leave the process with the file descriptors it
// had before it (a memfd, socket or file a code path forgets to close fails here; the first run
// lets lazily opened process-wide ones settle), and the corpus must hold no two identical seeds
// (a copy replays nothing new and hides that the seed it meant to add is missing). And what each
// seed reaches (fuzz_reach.h): every seed drives at least one step past decoding its bytes, and
// the corpus together reaches every step kind its target names (LLVMFuzzerTestOneInput itself
// always returns 0, so its return value says nothing).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_reach.h"
#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Steps reached, by kind, since the last clear() (the targets call the hook on the replaying thread).
std::map<std::string, size_t>& Steps() {
  static auto* steps = new std::map<std::string, size_t>;
  return *steps;
}

}  // namespace

extern "C" void HisparseFuzzReached(const char* kind) { ++Steps()[kind]; }

namespace {

// Open file descriptors of this process (the directory's own descriptor not counted).
size_t OpenFds() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n - 1;
}

// OpenFds once it equals `expected`, or after ~200 ms of counts that do not. Another thread of
// the process may hold a descriptor for an instant: UBSan's vptr check probes memory through a
// pipe(2) the first time it sees a type, and a target's background thread (the page pool's worker)
// can do that while this thread counts (seen in CI: +2 after the first seed). A leaked descriptor
// stays open, so it still fails the check.
size_t SettledOpenFds(size_t expected) {
  size_t n = OpenFds();
  for (int i = 0; i < 200 && n != expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = OpenFds();
  }
  return n;
}

TEST(CorpusReplay, EverySeedRunsClean) {
  const char* dir = std::getenv("HISPARSE_CORPUS_DIR");
  ASSERT_TRUE(dir != nullptr && *dir) << "set HISPARSE_CORPUS_DIR to the target's seed corpus folder";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());  // a stable order makes a failure reproducible
  ASSERT_FALSE(files.empty()) << "no seed files in " << dir;
  std::set<std::string> kinds;
  for (const char* const* k = HisparseFuzzStepKinds(); *k != nullptr; ++k) kinds.insert(*k);
  ASSERT_FALSE(kinds.empty()) << "the target names no step kinds";
  std::set<std::string> seen;
  std::map<std::string, size_t> corpus_steps;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << "cannot read " << path;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(seen.insert(bytes).second) << path << " repeats an earlier seed byte for byte";
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    Steps().clear();
    EXPECT_EQ(LLVMFuzzerTestOneInput(data, bytes.size()), 0) << path;
    size_t steps = 0;
    for (const auto& [kind, n] : Steps()) {
      EXPECT_EQ(kinds.count(kind), 1u) << path << " reached \"" << kind << "\", a kind its target does not name";
      corpus_steps[kind] += n;
      steps += n;
    }
    EXPECT_GT(steps, 0u) << path << " drives no step past decoding its bytes";
    const size_t fds = OpenFds();
    EXPECT_EQ(LLVMFuzzerTestOneInput(data, bytes.size()), 0) << path;
    EXPECT_EQ(SettledOpenFds(fds), fds) << path << " leaves file descriptors open";
  }
  for (const std::string& kind : kinds) {
    EXPECT_GT(corpus_steps[kind], 0u) << "no seed in " << dir << " reaches \"" << kind << "\"";
  }
  // The empty input is every target's smallest case.
  EXPECT_EQ(LLVMFuzzerTestOneInput(nullptr, 0), 0);
}

}  // namespace
