// Placeholder: the CPU reference of RESOLVE lands here.
#include "hisparse/kernels/resolve.h"
