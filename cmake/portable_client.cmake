# libhisparse, self-contained (the library the Python wheel carries; issue 40).
#
# The ordinary `hisparse` target links this machine's shared gRPC, protobuf and Abseil (about 60
# libraries), which an engine's image (Ubuntu, pip's grpcio/protobuf/torch) does not have. This
# target links the same objects against the static archives instead (Debian ships them, built
# position-independent), plus libstdc++ and libgcc, and exports nothing but the C ABI (hs_*): the
# result needs only glibc (libc, libm, libpthread, libdl, librt) and, built with CUDA, the CUDA
# runtime (libcudart.so.13, carried in the wheel beside it) and libcuda.so.1, which the runtime
# and hisparse/common/cuda_vmm.h dlopen. tests/install/wheel_test.sh holds those properties.
#
# Output: build/portable/libhisparse.so (no SONAME version: it lives inside the wheel beside the
# package that loads it by path). HISPARSE_PORTABLE_CLIENT=AUTO builds it when every archive is
# found, ON requires them, OFF skips it.
set(HISPARSE_PORTABLE_CLIENT "AUTO" CACHE STRING
  "Build build/portable/libhisparse.so with gRPC, protobuf, Abseil and libstdc++ linked in: AUTO, ON, OFF")
set_property(CACHE HISPARSE_PORTABLE_CLIENT PROPERTY STRINGS AUTO ON OFF)

# What `pkg-config --static --libs grpc++_unsecure protobuf` names on Debian 12, less the glibc
# parts (the client speaks to a unix socket: no TLS, so no OpenSSL).
set(_hs_portable_archives
  grpc++_unsecure grpc_unsecure gpr upb address_sorting re2 cares z protobuf
  absl_bad_optional_access absl_bad_variant_access absl_base absl_city absl_civil_time absl_cord
  absl_cord_internal absl_cordz_functions absl_cordz_handle absl_cordz_info absl_debugging_internal
  absl_demangle_internal absl_exponential_biased absl_graphcycles_internal absl_hash
  absl_hashtablez_sampler absl_int128 absl_log_severity absl_low_level_hash absl_malloc_internal
  absl_random_distributions absl_random_internal_platform absl_random_internal_pool_urbg
  absl_random_internal_randen absl_random_internal_randen_hwaes absl_random_internal_randen_hwaes_impl
  absl_random_internal_randen_slow absl_random_internal_seed_material absl_random_seed_gen_exception
  absl_random_seed_sequences absl_raw_hash_set absl_raw_logging_internal absl_spinlock_wait
  absl_stacktrace absl_status absl_statusor absl_str_format_internal absl_strerror absl_strings
  absl_strings_internal absl_symbolize absl_synchronization absl_throw_delegate absl_time
  absl_time_zone)

# Debian's archives are -fPIE: six of their translation units reach thread-locals with local-exec
# TLS relocations, which no shared library may hold. tools/fetch-pic-sources.sh fetches Debian's
# sources of the installed versions; those six are recompiled -fPIC here and linked ahead of the
# archives, so the archives' own copies are never pulled in.
set(HISPARSE_DEBIAN_SRC "${PROJECT_SOURCE_DIR}/.deps/debian-src" CACHE PATH
  "Debian sources of abseil, protobuf and re2 (tools/fetch-pic-sources.sh)")
set(_hs_pic_sources
  abseil/absl/base/internal/sysinfo.cc
  abseil/absl/container/internal/raw_hash_set.cc
  abseil/absl/random/internal/pool_urbg.cc
  abseil/absl/strings/internal/cordz_functions.cc
  protobuf/src/google/protobuf/arena.cc
  re2/re2/re2.cc)

set(_hs_portable_paths)
set(_hs_portable_missing)
if(NOT HISPARSE_PORTABLE_CLIENT STREQUAL "OFF" AND NOT HISPARSE_SANITIZE AND NOT HISPARSE_FUZZ)
  foreach(lib IN LISTS _hs_portable_archives)
    find_library(HS_STATIC_${lib} NAMES lib${lib}.a NO_CACHE)
    if(HS_STATIC_${lib})
      list(APPEND _hs_portable_paths ${HS_STATIC_${lib}})
    else()
      list(APPEND _hs_portable_missing lib${lib}.a)
    endif()
  endforeach()
  foreach(src IN LISTS _hs_pic_sources)
    if(NOT EXISTS ${HISPARSE_DEBIAN_SRC}/${src})
      list(APPEND _hs_portable_missing "${HISPARSE_DEBIAN_SRC}/${src} (run tools/fetch-pic-sources.sh)")
      break()
    endif()
  endforeach()
endif()

if(HISPARSE_PORTABLE_CLIENT STREQUAL "OFF" OR HISPARSE_SANITIZE OR HISPARSE_FUZZ)
  message(STATUS "hisparse: self-contained libhisparse (build/portable) not built")
elseif(_hs_portable_missing)
  if(HISPARSE_PORTABLE_CLIENT STREQUAL "ON")
    message(FATAL_ERROR "hisparse: HISPARSE_PORTABLE_CLIENT=ON but missing: ${_hs_portable_missing}")
  endif()
  message(STATUS "hisparse: self-contained libhisparse not built (missing ${_hs_portable_missing})")
else()
  message(STATUS "hisparse: self-contained libhisparse: build/portable/libhisparse.so")
  list(TRANSFORM _hs_pic_sources PREPEND ${HISPARSE_DEBIAN_SRC}/)
  add_library(hisparse_pic_fixups OBJECT ${_hs_pic_sources})
  # Third-party code at its own warning level; the installed headers, not the source trees', so
  # the objects match the archives they stand in for (re2's internal util/ headers excepted).
  set_target_properties(hisparse_pic_fixups PROPERTIES COMPILE_OPTIONS "-w;-fPIC" UNITY_BUILD OFF)
  set_source_files_properties(${HISPARSE_DEBIAN_SRC}/re2/re2/re2.cc PROPERTIES
    INCLUDE_DIRECTORIES ${HISPARSE_DEBIAN_SRC}/re2)
  add_library(hisparse_portable SHARED $<TARGET_OBJECTS:hisparse_pic_fixups> $<TARGET_OBJECTS:hisparse_c_api>
    ${CMAKE_CURRENT_SOURCE_DIR}/portable_glibc_shim.c ${CMAKE_CURRENT_SOURCE_DIR}/portable_arc4random.c)
  set_target_properties(hisparse_portable PROPERTIES OUTPUT_NAME hisparse
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/portable
    LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/libhisparse.map)
  # The project's own archives by file, not by target: a target would bring its shared gRPC,
  # protobuf and Abseil along with it.
  set(_hs_own hisparse_client_impl hisparse_proto hisparse_kernels hisparse_common)
  if(HISPARSE_HAVE_CUDA)
    list(PREPEND _hs_own hisparse_kernels_cuda hisparse_cuda_vmm)
  endif()
  add_dependencies(hisparse_portable ${_hs_own})
  set(_hs_own_files)
  foreach(t IN LISTS _hs_own)
    list(APPEND _hs_own_files $<TARGET_FILE:${t}>)
  endforeach()
  # The CUDA runtime stays a shared library, carried in the wheel beside this one (RUNPATH
  # $ORIGIN; tools/build-wheel.sh copies it): gRPC's and Abseil's -fPIE objects reach their
  # thread-locals with initial-exec TLS, which puts this library's whole TLS block in the static
  # TLS that glibc must find room for at dlopen, and cudart_static's 4 KiB, page-aligned block
  # does not fit there ("cannot allocate memory in static TLS block"). libcudart.so keeps its
  # TLS dynamic, needs only glibc, and dlopens libcuda.so.1 as cudart_static would.
  set(_hs_cudart)
  if(HISPARSE_HAVE_CUDA)
    set(_hs_cudart CUDA::cudart)
    set_target_properties(hisparse_portable PROPERTIES INSTALL_RPATH "\$ORIGIN" BUILD_WITH_INSTALL_RPATH ON)
  endif()
  target_link_libraries(hisparse_portable PRIVATE
    -Wl,--start-group ${_hs_own_files} ${_hs_portable_paths} -Wl,--end-group ${_hs_cudart}
    -static-libstdc++ -static-libgcc
    -Wl,--exclude-libs,ALL
    -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/libhisparse.map
    -Wl,-z,defs -Wl,--gc-sections -Wl,-O1
    -Wl,-Bstatic -latomic -Wl,-Bdynamic
    Threads::Threads ${CMAKE_DL_LIBS} rt m)
endif()

# hisparse-ctl, self-contained (build/portable/hisparse-ctl): the same objects as build/bin's, linked
# against the same static archives, libstdc++ and libgcc, so that it runs from the wheel (a venv's
# bin/, tools/build-wheel.sh) with nothing on LD_LIBRARY_PATH and needs only glibc. An executable
# may hold the archives' -fPIE code as it is: no recompiled objects. tests/install/wheel_test.sh
# holds what it needs.
if(TARGET hisparse_portable)
  add_executable(hisparse_portable_ctl $<TARGET_OBJECTS:hisparse_ctl_objects>
    ${CMAKE_CURRENT_SOURCE_DIR}/portable_arc4random.c)
  set_target_properties(hisparse_portable_ctl PROPERTIES OUTPUT_NAME hisparse-ctl
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/portable)
  set(_hs_ctl_own hisparse_proto hisparse_grpc_std_protos hisparse_common)
  add_dependencies(hisparse_portable_ctl ${_hs_ctl_own})
  set(_hs_ctl_own_files)
  foreach(t IN LISTS _hs_ctl_own)
    list(APPEND _hs_ctl_own_files $<TARGET_FILE:${t}>)
  endforeach()
  # yaml-cpp (config --json) from its static archive, as the executable may hold -fPIE code.
  find_library(HS_STATIC_yaml_cpp NAMES libyaml-cpp.a REQUIRED)
  target_link_libraries(hisparse_portable_ctl PRIVATE
    -Wl,--start-group ${_hs_ctl_own_files} ${_hs_portable_paths} ${HS_STATIC_yaml_cpp} -Wl,--end-group
    -static-libstdc++ -static-libgcc -Wl,--gc-sections -Wl,-O1
    -Wl,-Bstatic -latomic -Wl,-Bdynamic
    Threads::Threads ${CMAKE_DL_LIBS} rt m)
endif()
