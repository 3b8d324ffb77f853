// Secrets the daemon hands out: session tokens and import grant ids. Both are capabilities (who
// holds one may act on what it names), so they come from the kernel's CSPRNG, never a seeded PRNG.
#ifndef HISPARSE_COMMON_SECRET_H_
#define HISPARSE_COMMON_SECRET_H_

#include <string>

namespace hisparse {

// 128 bits from getrandom(2), as 32 lowercase hex digits. Blocks only until the kernel's pool is
// initialised (once per boot); retries short reads and EINTR.
std::string NewSecret128();

}  // namespace hisparse

#endif  // HISPARSE_COMMON_SECRET_H_
