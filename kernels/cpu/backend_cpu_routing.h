/* kernels/cpu/backend_cpu_routing.h — the attention-over-depth and MSAR entries of the cpu op
 * table, split from backend_cpu.c (as backend_cuda_internal.h splits the cuda table).
 */
#ifndef FATHOM_KERNELS_CPU_BACKEND_CPU_ROUTING_H
#define FATHOM_KERNELS_CPU_BACKEND_CPU_ROUTING_H

#include "runtime/backend.h"

/* Sets route_*, add_scaled*, stream_conv_*, stream_mix_* and route_conv_* of `table`. */
void backend_cpu_fill_routing(Backend *table);

#endif
