/*
 * layout.c: the host side of kernels/allreduce_params.h, compiled into the library so that the
 * Rust core calls the header's own macros instead of re-deriving them (one definition of the
 * workspace layout and the launch rule).
 */
#include "allreduce_params.h"

uint64_t ear_workspace_bytes(uint64_t max_msg_bytes, int32_t nranks)
{
    return EAR_WORKSPACE_BYTES(max_msg_bytes, (uint64_t)nranks);
}

uint64_t ear_lamport_max_msg(uint64_t max_msg_bytes)
{
    return EAR_LAMPORT_MAX_MSG(max_msg_bytes);
}

uint32_t ear_grid(uint64_t work_vecs, uint32_t max_blocks)
{
    return EAR_GRID(work_vecs, max_blocks);
}

uint64_t ear_params_size(void)
{
    return sizeof(EarAllReduceParams);
}

uint32_t ear_state_bytes(void)
{
    return EAR_STATE_BYTES;
}
