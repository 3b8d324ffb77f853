// Byte sizes as people write them ("64GiB", "1.5 GiB", "4096") and as tables show them.
//
// Free functions over values; no state, safe to call from any thread.
//
// Grammar accepted by ParseByteSize (case-insensitive, surrounding whitespace ignored):
//   size   := number [ws] [unit]
//   number := digits [ "." digits ]            (no sign, no exponent)
//   unit   := "" | "B"                          bytes
//           | "K" | "KiB" | "Ki"  (x 2^10)
//           | "M" | "MiB" | "Mi"  (x 2^20)
//           | "G" | "GiB" | "Gi"  (x 2^30)
//           | "T" | "TiB" | "Ti"  (x 2^40)
//           | "P" | "PiB" | "Pi"  (x 2^50)
// One rule: every unit is binary. A bare letter too ("2G" == "2GiB"): memory sizes are powers of
// two far more often than not, and that is what `free -g`, Kubernetes' "Gi" and most daemons mean.
// The decimal units "KB", "MB", "GB", "TB", "PB" are refused, naming the binary spelling and
// the decimal reading ("8GB": write 8GiB, or 8000000000 for exactly that many bytes, 7.45 GiB):
// read as SI they made "8GB" silently 7.45 GiB, while "100MB" failed as no multiple of 4KiB.
// A fraction is exact and then rounded to the nearest byte ("0.1KiB" == 102); a fraction of a
// plain byte count ("1.5" or "1.5B") is refused, since it can only be a typo.
#ifndef HISPARSE_COMMON_SIZE_PARSE_H_
#define HISPARSE_COMMON_SIZE_PARSE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace hisparse {

// The rule, as every refusal of a size states it (ParseByteSize's and the config's).
inline constexpr char kByteSizeRule[] =
    "sizes are bytes or binary units: K or KiB = 1024, M/MiB, G/GiB, T/TiB, P/PiB; KB, MB, GB, TB and PB are "
    "refused; pool, page and slab sizes are whole multiples of 4KiB";

// Parses `text` per the grammar above. Errors are InvalidArgument and quote the input, e.g.
//   cannot parse "12XB" as a byte size: unknown unit "XB"
// Empty input, a sign, garbage, unknown units and values above 2^64-1 are refused.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

// Human form for tables and logs, three significant digits in the largest binary unit that keeps
// the number >= 1: 512 -> "512 B", 2^30 -> "1.00 GiB", 64 MiB -> "64.0 MiB", 300 MiB -> "300 MiB".
// Lossy: do not parse it back when the exact value matters (use FormatByteSizeExact).
std::string FormatByteSize(uint64_t bytes);

// Exact form that ParseByteSize reads back to the same value: the largest binary unit that
// divides `bytes` exactly, no space: 2^30 -> "1GiB", 1536 MiB -> "1536MiB", 1000 -> "1000",
// 0 -> "0". Used where configs are rendered.
std::string FormatByteSizeExact(uint64_t bytes);

}  // namespace hisparse

#endif  // HISPARSE_COMMON_SIZE_PARSE_H_
