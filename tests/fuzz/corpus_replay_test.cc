// Corpus replay: runs a fuzz target's LLVMFuzzerTestOneInput over every file of its seed corpus,
// as a plain GoogleTest, so that the normal (gcc, no libFuzzer) build and CI's ctest run cover the
// targets and their seeds. The corpus folder comes from $HISPARSE_CORPUS_DIR, which ctest sets
// (tests/fuzz/CMakeLists.txt); nothing about the source tree is compiled in, so the binary runs
// anywhere. A target aborts on a finding, which fails the test with the file being replayed in
// the log.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

TEST(CorpusReplay, EverySeedRunsClean) {
  const char* dir = std::getenv("HISPARSE_CORPUS_DIR");
  ASSERT_TRUE(dir != nullptr && *dir) << "set HISPARSE_CORPUS_DIR to the target's seed corpus folder";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());  // a stable order makes a failure reproducible
  ASSERT_FALSE(files.empty()) << "no seed files in " << dir;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << "cannot read " << path;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0) << path;
  }
  // The empty input is every target's smallest case.
  EXPECT_EQ(LLVMFuzzerTestOneInput(nullptr, 0), 0);
}

}  // namespace
