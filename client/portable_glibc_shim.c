/* For the self-contained libhisparse only (cmake/portable_client.cmake): a glibc symbol that the
 * static archives would otherwise reach in a way a portable shared library cannot. This file
 * includes no header, so the name it defines is its own; it is hidden (never exported).
 *
 * stderr: Debian's static re2, protobuf and abseil archives are built -fPIE, which reads glibc's
 *   `stderr` as if it were copied into the executable (a PC-relative R_X86_64_PC32 reference); a
 *   shared library cannot hold that. The library's own `stderr`, which those references bind to,
 *   is set to glibc's stream before any other initializer of the library runs.
 * arc4random is portable_arc4random.c's, which the self-contained hisparse-ctl links too. */
extern void* dlsym(void* handle, const char* symbol);

__attribute__((visibility("hidden"))) void* stderr = 0;

__attribute__((constructor(101))) static void hs_portable_bind_stderr(void) {
  void** libc_stderr = (void**)dlsym((void*)0 /* RTLD_DEFAULT */, "stderr");
  if (libc_stderr != 0) stderr = *libc_stderr;
}
