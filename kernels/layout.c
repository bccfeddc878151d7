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

/* Offset of one-shot bank `bank` (0 or 1) from a workspace's base, and its size: the peer self-test's
 * bandwidth check stores into the next rank's bank 0 from its own bank 1 (src/group/selftest.rs). */
uint64_t ear_oneshot_bank_offset(uint64_t max_msg_bytes, int32_t nranks, uint32_t bank)
{
    (void)nranks; /* the one-shot banks come first in the data region, at every rank count */
    return EAR_SIGNAL_BYTES + EAR_OFF_ONESHOT(max_msg_bytes, (uint64_t)nranks) + bank * EAR_ONESHOT_BANK_BYTES(max_msg_bytes);
}

uint64_t ear_oneshot_bank_bytes(uint64_t max_msg_bytes)
{
    return EAR_ONESHOT_BANK_BYTES(max_msg_bytes);
}

uint64_t ear_selftest_params_size(void)
{
    return sizeof(EarSelfTestParams);
}

uint32_t ear_state_bytes(void)
{
    return EAR_STATE_BYTES;
}

uint64_t ear_fused_params_size(void)
{
    return sizeof(EarFusedParams);
}

/* The launch plans (allreduce_params.h's ear_plan_of, ear_norm_plan_of): the library's only
 * launch rules. */
EarPlan ear_plan(EarRule rule, int32_t family, int32_t op, uint64_t count, uint64_t tokens, uint32_t hidden,
                 uint32_t elem, int32_t nranks, uint32_t max_blocks, EarCallFacts facts)
{
    return ear_plan_of(rule, family, op, count, tokens, hidden, elem, nranks, max_blocks, facts);
}

EarPlan ear_norm_plan(uint64_t tokens, uint32_t hidden, uint32_t elem, int32_t sm_count)
{
    return ear_norm_plan_of(tokens, hidden, elem, sm_count);
}

/* A family's capacity and fused fit (its EarRule's). */
uint64_t ear_max_msg(EarCapacityRule rule, uint64_t max_msg_bytes)
{
    return ear_max_msg_of(rule, max_msg_bytes);
}

int ear_fused_fits(EarFusedFitRule rule, uint64_t tokens, uint32_t hidden, uint32_t elem, uint64_t max_msg_bytes,
                   int32_t nranks)
{
    return ear_fused_fits_of(rule, tokens, hidden, elem, max_msg_bytes, (uint64_t)nranks);
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
