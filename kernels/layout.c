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

uint64_t ear_push_max_msg(uint64_t max_msg_bytes)
{
    return EAR_PUSH_MAX_MSG(max_msg_bytes);
}

uint32_t ear_grid(uint64_t work_vecs, uint32_t max_blocks)
{
    return EAR_GRID(work_vecs, max_blocks);
}

uint32_t ear_lamport_block(uint64_t vecs, uint32_t max_blocks)
{
    return EAR_LAMPORT_BLOCK(vecs, max_blocks);
}

uint32_t ear_lamport_grid(uint64_t vecs, uint32_t max_blocks)
{
    return EAR_LAMPORT_GRID(vecs, max_blocks);
}

uint64_t ear_params_size(void)
{
    return sizeof(EarAllReduceParams);
}

uint64_t ear_abort_offset(void)
{
    return EAR_ABORT_OFFSET;
}

uint64_t ear_selftest_offset(uint64_t max_msg_bytes, int32_t nranks)
{
    return EAR_SELFTEST_OFFSET(max_msg_bytes, (uint64_t)nranks);
}

uint64_t ear_selftest_token(uint32_t src, uint32_t dst, uint32_t round)
{
    return EAR_SELFTEST_TOKEN(src, dst, round);
}

uint64_t ear_selftest_params_size(void)
{
    return sizeof(EarSelfTestParams);
}

uint32_t ear_state_bytes(void)
{
    return EAR_STATE_BYTES;
}

/* The fused all-reduce + residual + RMSNorm launch rule and size checks. family: EAR_FAMILY_*
 * (one-shot, two-shot, Lamport, push). */
uint32_t ear_fused_block(uint32_t hidden, uint32_t elem)
{
    return EAR_FUSED_BLOCK(hidden, elem);
}

uint32_t ear_fused_grid(uint64_t tokens, uint32_t max_blocks)
{
    return EAR_FUSED_GRID(tokens, max_blocks);
}

uint32_t ear_fused_lamport_grid(uint64_t tokens, uint32_t hidden, uint32_t elem, uint32_t max_blocks)
{
    return ear_fused_lamport_grid_of(tokens, hidden, elem, max_blocks);
}

int ear_fused_fits(int family, uint64_t tokens, uint32_t hidden, uint32_t elem, uint64_t max_msg_bytes, int32_t nranks)
{
    switch (family)
    {
    case EAR_FAMILY_ONESHOT: return EAR_FUSED_ONESHOT_FITS(tokens, hidden, elem, max_msg_bytes);
    case EAR_FAMILY_TWOSHOT: return EAR_FUSED_TWOSHOT_FITS(tokens, hidden, elem, max_msg_bytes, (uint64_t)nranks);
    case EAR_FAMILY_LAMPORT: return EAR_FUSED_LAMPORT_FITS(tokens, hidden, elem, max_msg_bytes);
    case EAR_FAMILY_PUSH: return EAR_FUSED_PUSH_FITS(tokens, hidden, elem, max_msg_bytes);
    default: return 0;
    }
}

uint64_t ear_fused_params_size(void)
{
    return sizeof(EarFusedParams);
}

/* The launch plan (allreduce_params.h's ear_plan_of): the library's only launch rule. */
EarPlan ear_plan(int32_t family, int32_t op, uint64_t count, uint64_t tokens, uint32_t hidden, uint32_t elem,
                 int32_t nranks, uint32_t max_blocks, int32_t sm_count)
{
    return ear_plan_of(family, op, count, tokens, hidden, elem, nranks, max_blocks, sm_count);
}

#define EAR_STORE_RANK_COUNT_(unused, N) \
    if (n < cap) out[n] = N;             \
    ++n;
/* The rank counts of EAR_FOR_EACH_RANK_COUNT into out[0..cap); returns how many there are. */
int32_t ear_rank_counts(int32_t* out, int32_t cap)
{
    int32_t n = 0;
    EAR_FOR_EACH_RANK_COUNT(EAR_STORE_RANK_COUNT_, 0)
    return n;
}
