#include "hisparse/common/size_parse.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hisparse {
namespace size_parse_test {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

uint64_t Parsed(const std::string& text) {
  absl::StatusOr<uint64_t> v = ParseByteSize(text);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.value_or(0);
}

TEST(ParseByteSizeTest, PlainBytes) {
  EXPECT_EQ(Parsed("0"), 0u);
  EXPECT_EQ(Parsed("1073741824"), kGiB);
  EXPECT_EQ(Parsed("512B"), 512u);
  EXPECT_EQ(Parsed("512 b"), 512u);
  EXPECT_EQ(Parsed("18446744073709551615"), std::numeric_limits<uint64_t>::max());
}

TEST(ParseByteSizeTest, BinaryUnits) {
  EXPECT_EQ(Parsed("4KiB"), 4 * kKiB);
  EXPECT_EQ(Parsed("512MiB"), 512 * kMiB);
  EXPECT_EQ(Parsed("64GiB"), 64 * kGiB);
  EXPECT_EQ(Parsed("2TiB"), 2 * kTiB);
  EXPECT_EQ(Parsed("1PiB"), kTiB * 1024);
  EXPECT_EQ(Parsed("3Gi"), 3 * kGiB);  // Kubernetes spelling
}

TEST(ParseByteSizeTest, BareLetterIsBinary) {
  EXPECT_EQ(Parsed("2G"), 2 * kGiB);
  EXPECT_EQ(Parsed("8k"), 8 * kKiB);
  EXPECT_EQ(Parsed("1M"), kMiB);
  EXPECT_EQ(Parsed("1T"), kTiB);
}

// One rule: units are binary. "8GB" read as SI was silently 7.45 GiB while "100MB" failed as no
// multiple of 4KiB; decimal units are refused, naming both the binary spelling and the reading.
TEST(ParseByteSizeTest, DecimalUnitsAreRefusedWithBothReadings) {
  for (const char* text : {"1KB", "5MB", "2GB", "1TB", "1PB", "8 gb", "1.25MB"}) {
    const absl::StatusOr<uint64_t> v = ParseByteSize(text);
    ASSERT_FALSE(v.ok()) << text << " parsed as " << *v;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("decimal units are not taken")) << text;
  }
  const std::string eight = std::string(ParseByteSize("8GB").status().message());
  EXPECT_THAT(eight, HasSubstr("write 8GiB for 8 GiB, or 8000000000 for exactly that many bytes (7.45 GiB)"));
  EXPECT_THAT(std::string(ParseByteSize("100MB").status().message()), HasSubstr("write 100MiB for 100 MiB"));
}

TEST(ParseByteSizeTest, EveryRefusalStatesTheRule) {
  for (const char* text : {"", "12XB", "-1GiB", "1.5", "99999999999PiB", "8GB", "GiB", "1..5GiB"}) {
    const absl::StatusOr<uint64_t> v = ParseByteSize(text);
    ASSERT_FALSE(v.ok()) << text;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(kByteSizeRule)) << text;
  }
}

TEST(ParseByteSizeTest, CaseAndWhitespace) {
  EXPECT_EQ(Parsed("64gib"), 64 * kGiB);
  EXPECT_EQ(Parsed("64GIB"), 64 * kGiB);
  EXPECT_EQ(Parsed("64 GiB"), 64 * kGiB);
  EXPECT_EQ(Parsed("64\tGiB"), 64 * kGiB);
  EXPECT_EQ(Parsed("  64GiB  "), 64 * kGiB);
}

TEST(ParseByteSizeTest, Fractions) {
  EXPECT_EQ(Parsed("1.5GiB"), kGiB + kGiB / 2);
  EXPECT_EQ(Parsed("0.5 KiB"), 512u);
  EXPECT_EQ(Parsed("1.0"), 1u);        // a zero fraction is a whole number
  EXPECT_EQ(Parsed("0.1KiB"), 102u);   // 102.4 rounds to nearest
  EXPECT_EQ(Parsed("0.0006KiB"), 1u);  // 0.6144 rounds up
  EXPECT_EQ(Parsed("1.25MiB"), 1310720u);
  EXPECT_EQ(Parsed("0.333333333333333333333GiB"), 357913941u);  // digits past 18 ignored
}

void ExpectRejected(const std::string& text, const std::string& why) {
  absl::StatusOr<uint64_t> v = ParseByteSize(text);
  ASSERT_FALSE(v.ok()) << text << " parsed as " << *v;
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("cannot parse \"" + text + "\" as a byte size"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(why)) << text;
}

TEST(ParseByteSizeTest, RejectsBadInput) {
  ExpectRejected("", "empty");
  ExpectRejected("   ", "empty");
  ExpectRejected("-1", "negative");
  ExpectRejected("-4GiB", "negative");
  ExpectRejected("+4GiB", "sign");
  ExpectRejected("GiB", "expected a number");
  ExpectRejected("abc", "expected a number");
  ExpectRejected(".5GiB", "expected a number");
  ExpectRejected("5.GiB", "digits after the decimal point");
  ExpectRejected("12XB", "unknown unit \"XB\"");
  ExpectRejected("4 gigabytes", "unknown unit");
  ExpectRejected("1e9", "unexpected \"e9\"");
  ExpectRejected("4GiB!", "unexpected \"GiB!\"");
  ExpectRejected("4 4", "unexpected \"4\"");
  ExpectRejected("1.2.3", "unexpected");
  ExpectRejected("1.5", "whole number");
  ExpectRejected("1.5B", "whole number");
}

TEST(ParseByteSizeTest, RejectsOverflow) {
  ExpectRejected("18446744073709551616", "too large");
  ExpectRejected("99999999999999999999999", "too large");
  ExpectRejected("16384PiB", "64 bits");
  ExpectRejected("16777216TiB", "64 bits");
  ExpectRejected("16383.99999999999999999PiB", "64 bits");
  EXPECT_EQ(Parsed("16383PiB"), uint64_t{16383} << 50);
}

TEST(ParseByteSizeTest, EscapesControlBytesInMessages) {
  absl::StatusOr<uint64_t> v = ParseByteSize(std::string("4\x01GiB", 5));
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("\\x01"));
}

TEST(FormatByteSizeTest, HumanForm) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(512), "512 B");
  EXPECT_EQ(FormatByteSize(1023), "1023 B");
  EXPECT_EQ(FormatByteSize(1024), "1.00 KiB");
  EXPECT_EQ(FormatByteSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatByteSize(kGiB), "1.00 GiB");
  EXPECT_EQ(FormatByteSize(64 * kMiB), "64.0 MiB");
  EXPECT_EQ(FormatByteSize(300 * kMiB), "300 MiB");
  EXPECT_EQ(FormatByteSize(1000 * kKiB), "1000 KiB");
  EXPECT_EQ(FormatByteSize(kMiB - 1), "1.00 MiB");       // 1023.999 KiB rounds up a unit
  EXPECT_EQ(FormatByteSize(10 * kKiB - 1), "10.0 KiB");  // 9.999 KiB: three digits, not four
  EXPECT_EQ(FormatByteSize(std::numeric_limits<uint64_t>::max()), "16.0 EiB");
}

TEST(FormatByteSizeTest, ExactFormRoundTrips) {
  EXPECT_EQ(FormatByteSizeExact(0), "0");
  EXPECT_EQ(FormatByteSizeExact(1000), "1000");
  EXPECT_EQ(FormatByteSizeExact(4096), "4KiB");
  EXPECT_EQ(FormatByteSizeExact(kGiB), "1GiB");
  EXPECT_EQ(FormatByteSizeExact(1536 * kMiB), "1536MiB");
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, kGiB + 4096, 3 * kTiB, uint64_t{1} << 62,
                     std::numeric_limits<uint64_t>::max()}) {
    EXPECT_EQ(Parsed(FormatByteSizeExact(v)), v) << FormatByteSizeExact(v);
  }
}

}  // namespace size_parse_test
}  // namespace hisparse
