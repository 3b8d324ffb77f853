#include "hisparse/common/size_parse.h"

#include <array>
#include <utility>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hisparse {
namespace {

struct Unit {
  std::string_view name;  // lower case
  uint64_t multiplier;
  bool decimal = false;  // KB, MB, ...: recognised only to be refused with the binary spelling
};

constexpr uint64_t kKi = uint64_t{1} << 10;
constexpr uint64_t kMi = uint64_t{1} << 20;
constexpr uint64_t kGi = uint64_t{1} << 30;
constexpr uint64_t kTi = uint64_t{1} << 40;
constexpr uint64_t kPi = uint64_t{1} << 50;

constexpr std::array<Unit, 22> kUnits = {{
    {"", 1},      {"b", 1},
    {"k", kKi},   {"ki", kKi},
    {"kib", kKi}, {"kb", 1000, true},
    {"m", kMi},   {"mi", kMi},
    {"mib", kMi}, {"mb", 1000 * 1000, true},
    {"g", kGi},   {"gi", kGi},
    {"gib", kGi}, {"gb", 1000 * 1000 * 1000, true},
    {"t", kTi},   {"ti", kTi},
    {"tib", kTi}, {"tb", 1000ull * 1000 * 1000 * 1000, true},
    {"p", kPi},   {"pi", kPi},
    {"pib", kPi}, {"pb", 1000ull * 1000 * 1000 * 1000 * 1000, true},
}};

// Debian's Abseil has its own string_view (ABSL_OPTION_USE_STD_STRING_VIEW is 0), which does not
// convert from std::string_view on its own.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// A quoted copy of the user's text for messages; escapes keep control bytes out of logs.
std::string Quote(std::string_view text) { return absl::StrCat("\"", absl::CHexEscape(ToAbsl(text)), "\""); }

absl::Status Invalid(std::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot parse ", Quote(text), " as a byte size: ", why, " (", kByteSizeRule, ")"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(ToAbsl(text));
  const std::string_view s(stripped.data(), stripped.size());
  if (s.empty()) return Invalid(text, "it is empty");
  if (s[0] == '-') return Invalid(text, "a size cannot be negative");
  if (s[0] == '+') return Invalid(text, "expected a number without a sign");

  size_t i = 0;
  // Integer part, with overflow checked digit by digit.
  uint64_t whole = 0;
  const size_t whole_begin = i;
  for (; i < s.size() && IsDigit(s[i]); ++i) {
    if (__builtin_mul_overflow(whole, uint64_t{10}, &whole) ||
        __builtin_add_overflow(whole, static_cast<uint64_t>(s[i] - '0'), &whole)) {
      return Invalid(text, "the number is too large");
    }
  }
  if (i == whole_begin) return Invalid(text, "expected a number at the start");

  // Fraction: keep up to 18 digits exactly (10^18 < 2^63); more precision than that is noise.
  uint64_t frac = 0;
  uint64_t frac_scale = 1;
  bool has_fraction = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    const size_t frac_begin = i;
    for (; i < s.size() && IsDigit(s[i]); ++i) {
      if (i - frac_begin < 18) {
        frac = frac * 10 + static_cast<uint64_t>(s[i] - '0');
        frac_scale *= 10;
      }
    }
    if (i == frac_begin) return Invalid(text, "expected digits after the decimal point");
    has_fraction = frac != 0;
  }

  while (i < s.size() && IsSpace(s[i])) ++i;
  const std::string_view unit_text = s.substr(i);
  const std::string unit = absl::AsciiStrToLower(ToAbsl(unit_text));
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (u.name == unit) {
      found = &u;
      break;
    }
  }
  if (found == nullptr) {
    bool letters = !unit.empty();
    for (char c : unit) letters = letters && absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (!letters) return Invalid(text, absl::StrCat("unexpected ", Quote(unit_text), " after the number"));
    return Invalid(text, absl::StrCat("unknown unit ", Quote(unit_text)));
  }
  if (found->decimal) {
    // Refused rather than read as powers of ten: "8GB" would then be 7.45 GiB, which is seldom what
    // was meant, and silently so. Say both readings.
    const std::string number(absl::StripTrailingAsciiWhitespace(ToAbsl(s.substr(0, i))));  // "8" of "8GB"
    const std::string binary = absl::AsciiStrToUpper(ToAbsl(unit_text.substr(0, 1))) + "iB";
    std::string decimal_reading;
    uint64_t exact = 0;
    if (!has_fraction && !__builtin_mul_overflow(whole, found->multiplier, &exact)) {
      decimal_reading = absl::StrCat(", or ", exact, " for exactly that many bytes (", FormatByteSize(exact), ")");
    }
    return Invalid(text, absl::StrCat("decimal units are not taken; write ", number, binary, " for ", number, " ",
                                      binary, decimal_reading));
  }
  if (has_fraction && found->multiplier == 1) {
    return Invalid(text, "a byte count must be a whole number");
  }

  uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, found->multiplier, &bytes)) {
    return Invalid(text, "the size does not fit in 64 bits");
  }
  if (has_fraction) {
    // frac / frac_scale * multiplier, rounded half up; 128 bits hold the product exactly.
    const absl::uint128 scaled = absl::uint128(frac) * found->multiplier + frac_scale / 2;
    const uint64_t frac_bytes = absl::Uint128Low64(scaled / frac_scale);
    if (__builtin_add_overflow(bytes, frac_bytes, &bytes)) {
      return Invalid(text, "the size does not fit in 64 bits");
    }
  }
  return bytes;
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr std::array<const char*, 7> kNames = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < kKi) return absl::StrCat(bytes, " B");
  size_t unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  // Three significant digits, decided on the rounded value so 9.999 prints "10.0", not "10.00",
  // and 1023.7 KiB prints "1.00 MiB", not "1024 KiB".
  if (value >= 1023.5 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  int decimals = 0;
  if (value < 9.995) {
    decimals = 2;
  } else if (value < 99.95) {
    decimals = 1;
  }
  return absl::StrFormat("%.*f %s", decimals, value, kNames[unit]);
}

std::string FormatByteSizeExact(uint64_t bytes) {
  static constexpr std::array<std::pair<uint64_t, const char*>, 5> kUnitsDesc = {
      {{kPi, "PiB"}, {kTi, "TiB"}, {kGi, "GiB"}, {kMi, "MiB"}, {kKi, "KiB"}}};
  if (bytes == 0) return "0";
  for (const auto& [mult, name] : kUnitsDesc) {
    if (bytes % mult == 0) return absl::StrCat(bytes / mult, name);
  }
  return absl::StrCat(bytes);
}

}  // namespace hisparse
