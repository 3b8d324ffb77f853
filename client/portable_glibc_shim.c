/* For the self-contained libhisparse only (cmake/portable_client.cmake): two glibc symbols that
 * the static archives would otherwise reach in a way a portable shared library cannot. This file
 * includes no header, so the names it defines are its own; both are hidden (never exported).
 *
 * stderr: Debian's static re2, protobuf and abseil archives are built -fPIE, which reads glibc's
 *   `stderr` as if it were copied into the executable (a PC-relative R_X86_64_PC32 reference); a
 *   shared library cannot hold that. The library's own `stderr`, which those references bind to,
 *   is set to glibc's stream before any other initializer of the library runs.
 * arc4random: GCC 12's static libstdc++ uses it for std::random_device, and it is new in glibc
 *   2.36, past Ubuntu 22.04's 2.35 (the oldest base an engine's image uses). getrandom (2.25)
 *   gives the same: random bytes from the kernel. */
typedef unsigned int hs_u32;
typedef long hs_ssize;
extern void* dlsym(void* handle, const char* symbol);
extern hs_ssize getrandom(void* buf, unsigned long len, unsigned int flags);

__attribute__((visibility("hidden"))) void* stderr = 0;

__attribute__((constructor(101))) static void hs_portable_bind_stderr(void) {
  void** libc_stderr = (void**)dlsym((void*)0 /* RTLD_DEFAULT */, "stderr");
  if (libc_stderr != 0) stderr = *libc_stderr;
}

__attribute__((visibility("hidden"))) hs_u32 arc4random(void) {
  hs_u32 value = 0;
  while (getrandom(&value, sizeof value, 0) != (hs_ssize)sizeof value) {
  }
  return value;
}
