/* For the self-contained libhisparse and hisparse-ctl (cmake/portable_client.cmake). This file
 * includes no header, so the name it defines is its own; it is hidden (never exported).
 *
 * arc4random: GCC 12's static libstdc++ uses it for std::random_device, and it is new in glibc
 *   2.36, past Ubuntu 22.04's 2.35 (the oldest base an engine's image uses). getrandom (2.25)
 *   gives the same: random bytes from the kernel. */
typedef unsigned int hs_u32;
typedef long hs_ssize;
extern hs_ssize getrandom(void* buf, unsigned long len, unsigned int flags);

__attribute__((visibility("hidden"))) hs_u32 arc4random(void) {
  hs_u32 value = 0;
  while (getrandom(&value, sizeof value, 0) != (hs_ssize)sizeof value) {
  }
  return value;
}
