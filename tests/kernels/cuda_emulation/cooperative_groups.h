// The cluster part of <cooperative_groups.h> for the host emulation (cuda_runtime.h beside it): the
// blocks of a cluster run at once, sync() is a barrier of all their threads, and map_shared_rank
// finds the same variable in another block's shared memory.
#ifndef HISPARSE_TESTS_KERNELS_CUDA_EMULATION_COOPERATIVE_GROUPS_H_
#define HISPARSE_TESTS_KERNELS_CUDA_EMULATION_COOPERATIVE_GROUPS_H_
#include <cstddef>

#include "cuda_runtime.h"

namespace cooperative_groups {

class cluster_group {
 public:
  static void sync() { g_emu_cluster->all->arrive_and_wait(); }
  static unsigned num_blocks() { return static_cast<unsigned>(g_emu_cluster->blocks.size()); }
  static unsigned block_rank() { return g_emu_rank; }
  template <typename T>
  static T* map_shared_rank(T* addr, int rank) {
    const std::ptrdiff_t off = reinterpret_cast<char*>(addr) - g_emu->shared.data();
    return reinterpret_cast<T*>(g_emu_cluster->blocks[static_cast<size_t>(rank)]->shared.data() + off);
  }
};

inline cluster_group this_cluster() { return {}; }

}  // namespace cooperative_groups

#endif  // HISPARSE_TESTS_KERNELS_CUDA_EMULATION_COOPERATIVE_GROUPS_H_
