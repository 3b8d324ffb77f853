// See secret.h.
#include "hisparse/common/secret.h"

#include <sys/random.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace hisparse {

std::string NewSecret128() {
  uint8_t raw[16];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string hex;
  for (uint8_t b : raw) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

}  // namespace hisparse
