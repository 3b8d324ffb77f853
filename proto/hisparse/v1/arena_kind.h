// The one mapping between v1::ArenaKind (hisparse.proto) and the arena kind's old string spelling
// ("host", "cuda-vmm", "cuda-ipc"), which ArenaInfo.kind and SessionStats.arena_kind still carry
// for peers older than the enum. The daemon fills both fields with SetArenaKind; clients read the
// kind with ArenaKindOf, which falls back to the string where an older daemon sent only that.
// Pure functions; thread-safe.
#ifndef HISPARSE_V1_ARENA_KIND_H_
#define HISPARSE_V1_ARENA_KIND_H_

#include <string_view>

#include "hisparse/v1/hisparse.pb.h"

namespace hisparse::v1 {

// "host", "cuda-vmm" or "cuda-ipc"; "" for ARENA_KIND_UNSPECIFIED or a value this build does not know.
inline const char* ArenaKindName(ArenaKind kind) {
  switch (kind) {
    case ARENA_KIND_HOST:
      return "host";
    case ARENA_KIND_CUDA_VMM:
      return "cuda-vmm";
    case ARENA_KIND_CUDA_IPC:
      return "cuda-ipc";
    default:
      return "";
  }
}

// The kind an old string spelling names; ARENA_KIND_UNSPECIFIED for any other string.
inline ArenaKind ArenaKindFromName(std::string_view name) {
  for (ArenaKind k : {ARENA_KIND_HOST, ARENA_KIND_CUDA_VMM, ARENA_KIND_CUDA_IPC}) {
    if (name == ArenaKindName(k)) return k;
  }
  return ARENA_KIND_UNSPECIFIED;
}

// The arena's kind: the enum, or (a daemon older than kind_enum) what the string names.
inline ArenaKind ArenaKindOf(const ArenaInfo& arena) {
  return arena.kind_enum() != ARENA_KIND_UNSPECIFIED ? arena.kind_enum() : ArenaKindFromName(arena.kind());
}

// Fills both the enum and the deprecated string.
inline void SetArenaKind(ArenaKind kind, ArenaInfo* arena) {
  arena->set_kind_enum(kind);
  arena->set_kind(ArenaKindName(kind));
}
inline void SetArenaKind(ArenaKind kind, SessionStats* stats) {
  stats->set_arena_kind_enum(kind);
  stats->set_arena_kind(ArenaKindName(kind));
}

}  // namespace hisparse::v1

#endif  // HISPARSE_V1_ARENA_KIND_H_
