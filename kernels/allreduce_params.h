/*
 * allreduce_params.h: the host <-> kernel contract of the custom all-reduce kernels.
 *
 * Plain C (C99/C11), also included from C++ and CUDA. Only <stdint.h>; no CUDA types.
 * The constants and the two parameter blocks come from ear_contract.h, which cbindgen writes
 * from src/contract.rs; the rules below are built on them, and the Rust core calls these
 * macros through layout.c. Nothing is mirrored by hand. Any change to the layout or the
 * protocol changes EAR_PROTOCOL_ID (src/contract.rs).
 *
 * Protocols, ordering and why slot reuse is safe: the top of each kernel file (oneshot.cu,
 * twoshot.cu, lamport.cu, push.cu and their *_norm.cu).
 *
 * ---------------------------------------------------------------------------------------
 * Workspace of ONE rank: one device allocation, zero-filled by the host at creation, never
 * written by the host again, mapped into every peer process (IPC). Layout:
 *
 *   [ signal region : EAR_SIGNAL_BYTES                ]  offset 0
 *   [ data region   : EAR_DATA_BYTES(max_msg, nranks) ]  offset EAR_SIGNAL_BYTES
 *   [ self-test     : EAR_SELFTEST_BYTES              ]  offset EAR_SELFTEST_OFFSET(max_msg, nranks)
 *
 *   signal region: uint64_t slot[EAR_MAX_BLOCKS][EAR_MAX_RANKS]; slot[b][r] is written
 *                  (st.release.sys; the in-place one-shot's "done" relaxed) only by CTA b of
 *                  rank r, read only by its owner;
 *                  then one 128-byte line whose first uint64_t is the ABORT word
 *                  (EAR_ABORT_OFFSET): 0 while the group is live, else an EAR_FAULT_* code:
 *                  written by any rank's kernel that gives up waiting (to every rank) and
 *                  by the host when it releases the group; read at the start of every call
 *                  (a call of an aborted group does nothing) and by every long wait
 *                  (kernels/wait.cuh);
 *                  then (EAR_POINTER_SLOTS_OFFSET) 16-byte entries pointer_slot[EAR_MAX_BLOCKS]
 *                  [EAR_MAX_RANKS] = {value, pointer}: written (one 16-byte atomic, sm_90+) only
 *                  by CTA b of rank r at the first barrier of a one-shot or 4+ rank two-shot
 *                  that exchanges pointers (EAR_CALL_POINTERS): the barrier's flag value and
 *                  rank r's input when peers may read it in place, else 0 (sync.cuh,
 *                  cta_barrier_sharing).
 *   data region  (offsets from the start of the data region, all 128-byte aligned):
 *     EAR_OFF_ONESHOT          2 banks x EAR_ONESHOT_BANK_BYTES(m)          (one-shot)
 *     EAR_OFF_TWOSHOT_STAGE    2 parities x (nranks-1) rows x EAR_TWOSHOT_SEG_BYTES(m, n)
 *                              (two-shot; row of a writer: EAR_TWOSHOT_STAGE_ROW)
 *     EAR_OFF_TWOSHOT_GATHER   nranks segs x EAR_TWOSHOT_SEG_BYTES(m, n)    (two-shot)
 *     EAR_OFF_LAMPORT          3 buffers x nranks rows x EAR_LAMPORT_ROW_BYTES(m)
 *     EAR_OFF_PUSH             2 parities x (nranks-1) rows x EAR_PUSH_ROW_BYTES(m)
 *                              (staged push; row of a source: EAR_PUSH_ROW)
 *   where m = max_msg_bytes (the largest count * elem_size the workspace serves; the same
 *   value goes into EarAllReduceParams.ws_max_bytes on every call) and n = nranks.
 *   Every rank of a communicator must create its workspace with the same (m, n).
 *   self-test area (kernels/selftest.cu, the peer self-test run before a group is trusted):
 *                  16-byte inbox[src] at EAR_SELFTEST_INBOX(src) for src < EAR_MAX_RANKS, written
 *                  only by rank src's ear_selftest; then the 16-byte local slot at
 *                  EAR_SELFTEST_LOCAL, written only by the owner's ear_selftest and read by its
 *                  peers'. No all-reduce kernel reads or writes it, and nothing clears it: each
 *                  self-test round writes tokens of its own (EAR_SELFTEST_TOKEN).
 *
 * State block of ONE rank: EAR_STATE_BYTES, a SEPARATE device allocation (any zero-filled
 * block, 16-byte aligned, e.g. its own cudaMalloc + cudaMemset 0), local only: never mapped
 * into peers, never touched by the host after the zero-fill. It holds one copy of the call
 * counters per CTA index; every advance happens in-kernel (CUDA-graph safe). One state
 * block per (workspace, rank), shared by all kernel families, used by one stream at a time.
 *
 * ---------------------------------------------------------------------------------------
 * Launch rule (host):
 *   - block = EAR_BLOCK_THREADS threads for ear_oneshot_barrier_* / ear_twoshot_polled_* /
 *     ear_push_staged_*; for ear_oneshot_lamport_* any multiple of 32 in [32, EAR_BLOCK_THREADS],
 *     EAR_LAMPORT_BLOCK(vecs, max_blocks) suggested (and then grid = EAR_LAMPORT_GRID(vecs,
 *     max_blocks)). No dynamic shared memory, the params by value as the only argument. The PDL
 *     attribute (programmatic stream serialization) is optional.
 *   - grid  = EAR_GRID(work_vecs, max_blocks) with
 *         vecs      = ceil(count * elem_size / 16)
 *         work_vecs = vecs                      for ear_oneshot_barrier_*, ear_oneshot_lamport_*,
 *                                               ear_push_staged_*
 *                   = ceil(vecs / nranks)       for ear_twoshot_polled_*
 *         max_blocks in [1, EAR_MAX_BLOCKS]     (tunable; the library uses EAR_MAX_BLOCKS)
 *     Any grid in [1, EAR_MAX_BLOCKS] is correct; what is REQUIRED is that the grid (and
 *     block, count, dtype, family) is IDENTICAL on every rank for the same call, and that every
 *     rank issues the same sequence of custom all-reduce calls on the same communicator
 *     (NCCL fallbacks in between do not matter).
 *   - ALL families spin on peers: all CTAs of the call on all ranks must be able to be
 *     co-resident (grid <= SM count; do not share the GPU with work that can starve it).
 *   - input and output 16-byte aligned (else use NCCL); output may equal input (in place);
 *     output must not partially overlap input.
 *   - dtype: f32, f16, bf16 (sum). count >= 1.
 *   - count * elem_size <= ws_max_bytes                           (oneshot, twoshot)
 *     count * elem_size <= EAR_LAMPORT_MAX_MSG(ws_max_bytes)      (lamport)
 *     count * elem_size <= EAR_PUSH_MAX_MSG(ws_max_bytes)         (push)
 *     Violations, nranks != the kernel's N or rank outside [0, N) trap (sticky error).
 *   - fault, timeout_ns, generation: every wait for a peer gives up after timeout_ns (0: never)
 *     and records generation << 8 | EAR_FAULT_* in *fault (NULL: nowhere); kernels/wait.cuh.
 * ---------------------------------------------------------------------------------------
 */
#ifndef EAR_ALLREDUCE_PARAMS_H
#define EAR_ALLREDUCE_PARAMS_H

#include <stdint.h>

#include "ear_contract.h"

/* Bytes per packed vector: every kernel moves 16-byte vectors. */
#define EAR_VEC_BYTES 16
#define EAR_ALIGN_BYTES 128
#define EAR_ROUND_UP(x, a) ((((uint64_t)(x)) + (uint64_t)(a) - 1u) / (uint64_t)(a) * (uint64_t)(a))
#define EAR_CEIL_DIV(x, y) ((((uint64_t)(x)) + (uint64_t)(y) - 1u) / (uint64_t)(y))

/* Signal region: uint64_t slot[EAR_MAX_BLOCKS][EAR_MAX_RANKS] (16 KiB), then the line of the
 * abort word, padded to 16 KiB, then the 16-byte pointer_slot[EAR_MAX_BLOCKS][EAR_MAX_RANKS]
 * (32 KiB): the data region starts 16 KiB-aligned. */
#define EAR_SLOT_BYTES ((uint64_t)EAR_MAX_BLOCKS * EAR_MAX_RANKS * 8u)
#define EAR_ABORT_OFFSET EAR_SLOT_BYTES
#define EAR_POINTER_SLOTS_OFFSET (2u * EAR_SLOT_BYTES)
#define EAR_SIGNAL_BYTES (4u * EAR_SLOT_BYTES)
/* Local state block (layout private to kernels/common.cuh: EAR_MAX_BLOCKS copies of the
 * call counters, 32 bytes each). */
#define EAR_STATE_BYTES (EAR_MAX_BLOCKS * 32u)

/* Lamport buffers are 3 x nranks x row per rank; the row (and so the largest Lamport
 * message) is capped so that the cap costs 3 * nranks * 2 MiB (48 MiB at 8 ranks). */
#define EAR_LAMPORT_MAX_BYTES ((uint64_t)2u << 20)
/* Staged push rows are 2 x (nranks - 1) per rank, capped likewise: 30 MiB at 16 ranks. */
#define EAR_PUSH_MAX_BYTES ((uint64_t)1u << 20)

/* 16-byte vectors in a message of m bytes. */
#define EAR_VECS(m) EAR_CEIL_DIV((m), EAR_VEC_BYTES)
/* One-shot: one bank holds a whole message. */
#define EAR_ONESHOT_BANK_BYTES(m) EAR_ROUND_UP(EAR_VECS(m) * EAR_VEC_BYTES, EAR_ALIGN_BYTES)
/* Two-shot: a segment is ceil(vecs / n) vectors. The gather holds n segments; the stage
 * one row per peer for each parity of the call number (a reader's rows are polled and
 * zeroed by it, so a row is rewritten only two calls later: twoshot.cu). Row of `writer`
 * in `reader`'s stage, for parity `par` (0 or 1): */
#define EAR_TWOSHOT_SEG_VECS(m, n) EAR_CEIL_DIV(EAR_VECS(m), (n))
#define EAR_TWOSHOT_SEG_BYTES(m, n) (EAR_TWOSHOT_SEG_VECS(m, n) * EAR_VEC_BYTES)
#define EAR_TWOSHOT_STAGE_ROW(par, writer, reader, n) \
  ((uint64_t)(par) * ((uint64_t)(n) - 1u) + (uint64_t)(writer) - ((writer) > (reader) ? 1u : 0u))
#define EAR_TWOSHOT_STAGE_BYTES(m, n) \
  EAR_ROUND_UP(2u * ((uint64_t)(n) - 1u) * EAR_TWOSHOT_SEG_BYTES(m, n), EAR_ALIGN_BYTES)
#define EAR_TWOSHOT_AREA_BYTES(m, n) \
  EAR_ROUND_UP((uint64_t)(n) * EAR_TWOSHOT_SEG_BYTES(m, n), EAR_ALIGN_BYTES)
/* Lamport: largest message and row size. */
#define EAR_LAMPORT_MAX_MSG(m) \
  (((uint64_t)(m)) < EAR_LAMPORT_MAX_BYTES ? ((uint64_t)(m)) : EAR_LAMPORT_MAX_BYTES)
#define EAR_LAMPORT_ROW_BYTES(m) EAR_ROUND_UP(EAR_LAMPORT_MAX_MSG(m), EAR_ALIGN_BYTES)
/* Staged push: largest message and row size. A reader holds one row per source for each parity
 * of the call number (a row is rewritten only two calls later: push.cu). Row of `src` in
 * `reader`'s region, for parity `par` (0 or 1): */
#define EAR_PUSH_MAX_MSG(m) (((uint64_t)(m)) < EAR_PUSH_MAX_BYTES ? ((uint64_t)(m)) : EAR_PUSH_MAX_BYTES)
#define EAR_PUSH_ROW_BYTES(m) EAR_ROUND_UP(EAR_PUSH_MAX_MSG(m), EAR_ALIGN_BYTES)
#define EAR_PUSH_ROW(par, src, reader, n) \
  ((uint64_t)(par) * ((uint64_t)(n) - 1u) + (uint64_t)(src) - ((src) > (reader) ? 1u : 0u))

/* Offsets inside the data region (add EAR_SIGNAL_BYTES for offsets from the base). */
#define EAR_OFF_ONESHOT(m, n) ((uint64_t)0u)
#define EAR_OFF_TWOSHOT_STAGE(m, n) (EAR_OFF_ONESHOT(m, n) + 2u * EAR_ONESHOT_BANK_BYTES(m))
#define EAR_OFF_TWOSHOT_GATHER(m, n) (EAR_OFF_TWOSHOT_STAGE(m, n) + EAR_TWOSHOT_STAGE_BYTES(m, n))
#define EAR_OFF_LAMPORT(m, n) (EAR_OFF_TWOSHOT_GATHER(m, n) + EAR_TWOSHOT_AREA_BYTES(m, n))
#define EAR_OFF_PUSH(m, n) (EAR_OFF_LAMPORT(m, n) + 3u * (uint64_t)(n) * EAR_LAMPORT_ROW_BYTES(m))

/* Data region size of one rank:
 *   2*B1(m) + round128(2*(n-1)*G) + round128(n*G) + 3*n*round128(min(m, 2 MiB))
 *   + 2*(n-1)*round128(min(m, 1 MiB)),
 *   B1(m) = round128(ceil(m/16)*16), G = ceil(ceil(m/16)/n)*16.
 *   About (5 - 2/n)*m + (8*n - 2) MiB for m >= 2 MiB (4*m + 14 MiB at 2 ranks). */
#define EAR_DATA_BYTES(m, n) \
  (EAR_OFF_PUSH(m, n) + 2u * ((uint64_t)(n) - 1u) * EAR_PUSH_ROW_BYTES(m))
/* Peer self-test area (kernels/selftest.cu), after the data region (128-byte aligned, as every
 * region before it): EAR_MAX_RANKS 16-byte inbox slots, then the 16-byte local slot on a line of
 * its own. Offsets below are from the start of the area. */
#define EAR_SELFTEST_SLOT_BYTES 16u
#define EAR_SELFTEST_INBOX(src) ((uint64_t)(src) * EAR_SELFTEST_SLOT_BYTES)
#define EAR_SELFTEST_LOCAL ((uint64_t)EAR_MAX_RANKS * EAR_SELFTEST_SLOT_BYTES)
#define EAR_SELFTEST_BYTES (EAR_SELFTEST_LOCAL + EAR_ALIGN_BYTES)
/* Offset of the self-test area from the workspace base. */
#define EAR_SELFTEST_OFFSET(m, n) (EAR_SIGNAL_BYTES + EAR_DATA_BYTES(m, n))
/* The token rank `src` writes for rank `dst` in self-test round `round` (src == dst: its own
 * slot): never zero (the magic's high word), so a zero-filled slot never holds one, and
 * distinct per (src, dst, round mod 2^16). A slot holds it as 16 bytes: the token, then its
 * complement. */
#define EAR_SELFTEST_TOKEN(src, dst, round)                                                    \
  (((uint64_t)EAR_SELFTEST_MAGIC << 32) | ((uint64_t)((uint32_t)(round) & 0xFFFFu) << 16) |   \
   ((uint64_t)((uint32_t)(src) & 0xFFu) << 8) | (uint64_t)((uint32_t)(dst) & 0xFFu))

/* The whole allocation of one rank. */
#define EAR_WORKSPACE_BYTES(m, n) (EAR_SELFTEST_OFFSET(m, n) + EAR_SELFTEST_BYTES)

/* Grid rule (see the launch rule above). */
#define EAR_GRID(work_vecs, max_blocks)                                                   \
  ((uint32_t)(EAR_CEIL_DIV((work_vecs), EAR_BLOCK_THREADS) < 1u ? 1u                      \
              : EAR_CEIL_DIV((work_vecs), EAR_BLOCK_THREADS) > (uint64_t)(max_blocks)     \
                  ? (uint64_t)(max_blocks)                                                \
                  : EAR_CEIL_DIV((work_vecs), EAR_BLOCK_THREADS)))

/* Lamport block (ear_oneshot_lamport_* only; see the launch rule): enough threads that the grid
 * reaches max_blocks CTAs before a CTA grows past EAR_BLOCK_THREADS, at least
 * EAR_LAMPORT_MIN_THREADS: mid-size messages are spread over more SMs (an SM's NVLink
 * stores and polls are the limit there, not the thread count). */
#define EAR_LAMPORT_MIN_THREADS 128u
#define EAR_LAMPORT_BLOCK(vecs, max_blocks)                                              \
  ((uint32_t)(EAR_ROUND_UP(EAR_CEIL_DIV((vecs), (max_blocks)), 32u) < EAR_LAMPORT_MIN_THREADS \
                  ? EAR_LAMPORT_MIN_THREADS                                              \
              : EAR_ROUND_UP(EAR_CEIL_DIV((vecs), (max_blocks)), 32u) > EAR_BLOCK_THREADS  \
                  ? (uint64_t)EAR_BLOCK_THREADS                                          \
                  : EAR_ROUND_UP(EAR_CEIL_DIV((vecs), (max_blocks)), 32u)))
/* Lamport grid: CTAs of EAR_LAMPORT_BLOCK threads covering the vectors, at most max_blocks. */
#define EAR_LAMPORT_GRID(vecs, max_blocks)                                               \
  ((uint32_t)(EAR_CEIL_DIV((vecs), EAR_LAMPORT_BLOCK(vecs, max_blocks)) < 1u ? 1u         \
              : EAR_CEIL_DIV((vecs), EAR_LAMPORT_BLOCK(vecs, max_blocks)) > (uint64_t)(max_blocks) \
                  ? (uint64_t)(max_blocks)                                               \
                  : EAR_CEIL_DIV((vecs), EAR_LAMPORT_BLOCK(vecs, max_blocks))))

/* The rank counts the kernels are instantiated for, written once: M(..., N) for each (Rust's
 * RANK_COUNTS is checked against this list through layout.c's ear_rank_counts). */
#define EAR_FOR_EACH_RANK_COUNT(M, ...) \
  M(__VA_ARGS__, 2) M(__VA_ARGS__, 4) M(__VA_ARGS__, 6) M(__VA_ARGS__, 8) M(__VA_ARGS__, 16)

/* EarAllReduceParams (ear_contract.h) is the only kernel argument, passed by value; the same for
 * EarSelfTestParams and ear_selftest, which reports into an EarSelfTestResult. */
#ifdef __cplusplus
static_assert(sizeof(EarAllReduceParams) == 200, "EarAllReduceParams must be 200 bytes");
static_assert(sizeof(EarSelfTestParams) == 176, "EarSelfTestParams must be 176 bytes");
static_assert(sizeof(EarSelfTestResult) == 152, "EarSelfTestResult must be 152 bytes");
static_assert(sizeof(EarSelfTestPushParams) == 32, "EarSelfTestPushParams must be 32 bytes");
static_assert(sizeof(void*) == 8, "64-bit targets only");
#else
_Static_assert(sizeof(EarAllReduceParams) == 200, "EarAllReduceParams must be 200 bytes");
_Static_assert(sizeof(EarSelfTestParams) == 176, "EarSelfTestParams must be 176 bytes");
_Static_assert(sizeof(EarSelfTestResult) == 152, "EarSelfTestResult must be 152 bytes");
_Static_assert(sizeof(EarSelfTestPushParams) == 32, "EarSelfTestPushParams must be 32 bytes");
_Static_assert(sizeof(void*) == 8, "64-bit targets only");
#endif

/* ---------------------------------------------------------------------------------------
 * Fused all-reduce + residual (+ bias) + RMSNorm: kernels/oneshot_norm.cu, twoshot_norm.cu,
 * lamport_norm.cu, push_norm.cu, rmsnorm.cu (ADDITIONS ONLY:
 * nothing above changes; the fused kernels use the same workspace regions, signal slots,
 * state counters and launch contract as the plain families: the top of each *_norm.cu).
 *
 *   residual_out = round_T( ((((+0.0f + x_0) + x_1) + ... + x_{N-1}) + bias) + residual )
 *   normed       = round_T( (float(residual_out) * s) * gamma ),
 *                  s = 1.0f / sqrtf(sum_row(float(residual_out)^2) / hidden + eps)
 * per token row, all in fp32; the norm reads the T-ROUNDED residual_out, so `normed` is a
 * pure function of the stored residual_out.
 *
 * Kernels (all take EarFusedParams by value as the only argument):
 *   ear_oneshot_barrier_norm_<t>_n<N>   one-shot (pull), 1 barrier, shares seq / banks / slots
 *   ear_twoshot_barrier_norm_<t>_n<N>   two-shot (push RS + push AG), 2 barriers, shares seq
 *   ear_oneshot_lamport_norm_<t>_n<N>   Lamport one-shot (push), no barrier, shares lam_seq
 *   ear_push_staged_norm_<t>_n<N>       staged push, N-1 flag handoffs, shares seq / slots
 *   ear_residual_rmsnorm_<t>            no ranks, no workspace (after an NCCL all-reduce):
 *                                       ar.input = x, ar.count = tokens*hidden, rest ignored
 *   t in {f32, f16, bf16}, N in {2, 4, 6, 8, 16}.
 *
 * Launch rule (host):
 *   - block = EAR_FUSED_BLOCK(hidden, elem_size) threads (a multiple of 32 in [32, 512]);
 *     any other block size traps. It depends only on (hidden, dtype), so it is identical on
 *     every rank; the per-row sum of squares is reduced in a fixed order for that block size.
 *   - grid  = EAR_FUSED_GRID(tokens, max_blocks): CTA b handles token rows b, b+grid, ...;
 *     for ear_oneshot_lamport_norm_*, ear_fused_lamport_grid_of(tokens, hidden, elem, nranks, max_blocks),
 *     which may exceed tokens: every CTA pushes (unless normed == x), CTAs b < tokens also
 *     reduce.
 *     Rank families: max_blocks in [1, EAR_MAX_BLOCKS]; any grid in [1, EAR_MAX_BLOCKS] is correct; the
 *     grid, tokens, hidden, dtype and family must be IDENTICAL on every rank for the same
 *     call, and plain and fused calls on one communicator form ONE call sequence that every
 *     rank issues identically (they share the state counters). All CTAs of a call on all
 *     ranks must be co-resident (grid <= SM count), as for the plain families.
 *     ear_residual_rmsnorm_<t>: any grid >= 1 (no spinning, no co-residency needed).
 *   - no dynamic shared memory; the PDL attribute is optional.
 *   - x (= ar.input), residual, residual_out, normed, gamma, bias: 16-byte aligned. Rows are
 *     moved as 16-byte vectors when hidden * elem_size % 16 == 0, element-wise otherwise.
 *     residual_out may equal residual, normed may equal x; no other overlap. ar.output is
 *     ignored. bias may be NULL (no bias). hidden >= 1, tokens >= 1, ar.count must equal
 *     tokens * hidden. residual, bias, gamma and eps must be identical on every rank (the
 *     two-shot computes each slice of residual_out on the rank that owns it).
 *   - size: rows are staged with a pitch of EAR_FUSED_ROW_VECS 16-byte vectors, so
 *       oneshot_norm: EAR_FUSED_ONESHOT_FITS(tokens, hidden, elem, m)
 *       twoshot_norm: EAR_FUSED_TWOSHOT_FITS(tokens, hidden, elem, m, n)
 *       lamport_norm: EAR_FUSED_LAMPORT_FITS(tokens, hidden, elem, m)
 *       push_norm:    EAR_FUSED_PUSH_FITS(tokens, hidden, elem, m)
 *     (for hidden * elem % 16 == 0 and 16-byte rows divisible by n these are exactly
 *     tokens * hidden * elem <= m, resp. <= EAR_LAMPORT_MAX_MSG(m), <= EAR_PUSH_MAX_MSG(m)).
 *     Violations, nranks != N, bad rank, grid > EAR_MAX_BLOCKS (rank families) or a wrong block
 *     trap (sticky error).
 * ---------------------------------------------------------------------------------------
 */
/* 16-byte vectors per token row (the last one may be partial). */
#define EAR_FUSED_ROW_VECS(hidden, elem) EAR_CEIL_DIV((uint64_t)(hidden) * (uint64_t)(elem), EAR_VEC_BYTES)
/* Block: one thread per 16-byte vector of a row, rounded up to a warp, capped at 512
 * (rows longer than 512 vectors take several vectors per thread). */
#define EAR_FUSED_BLOCK(hidden, elem)                                                     \
  ((uint32_t)(EAR_ROUND_UP(EAR_FUSED_ROW_VECS(hidden, elem), 32u) < 32u ? 32u             \
              : EAR_ROUND_UP(EAR_FUSED_ROW_VECS(hidden, elem), 32u) > EAR_FUSED_MAX_THREADS \
                  ? (uint64_t)EAR_FUSED_MAX_THREADS                                       \
                  : EAR_ROUND_UP(EAR_FUSED_ROW_VECS(hidden, elem), 32u)))
/* Grid: one CTA per token row, at most max_blocks (then rows are strided over CTAs). */
#define EAR_FUSED_GRID(tokens, max_blocks)                                                \
  ((uint32_t)((uint64_t)(tokens) < 1u ? 1u                                                \
              : (uint64_t)(tokens) > (uint64_t)(max_blocks) ? (uint64_t)(max_blocks)      \
                                                            : (uint64_t)(tokens)))
/* Lamport fused grid: one CTA per row and one per EAR_FUSED_BLOCK vectors (a thread per
 * vector pushes), and a call of few rows spread over max(4, nranks) CTAs of at least
 * EAR_FUSED_LAMPORT_MIN_SHARE vectors: a rank pushes and clears N - 1 copies of its rows, which
 * one SM issues slowly. At most max_blocks. CTA b owns rows b, b + grid, ...; out of place
 * every CTA pushes an even share (lamport_norm.cu). One H100, simulated ranks, 1 x 4096 bf16
 * (docs/runs/2026-12-06-h100-fused-push-spread.txt): 5.17 -> 5.11 us at 2 ranks (4 CTAs),
 * 6.83 -> 6.68 at 4 (4), 10.7 -> 9.98 at 8 (8); 8 rows at 8 ranks on 16 CTAs instead of 8
 * were slower (11.3 -> 11.7 us): hence a floor of CTAs, not a share size. */
#define EAR_FUSED_LAMPORT_MIN_SHARE 64u
static inline uint32_t ear_fused_lamport_grid_of(uint64_t tokens, uint32_t hidden, uint32_t elem,
                                                 int32_t nranks, uint32_t max_blocks) {
  const uint64_t vecs = tokens * EAR_FUSED_ROW_VECS(hidden, elem);
  const uint64_t per_thread = EAR_CEIL_DIV(vecs, EAR_FUSED_BLOCK(hidden, elem));
  const uint64_t spread_want = nranks > 4 ? (uint64_t)nranks : 4u;
  const uint64_t spread_max = EAR_CEIL_DIV(vecs, EAR_FUSED_LAMPORT_MIN_SHARE);
  const uint64_t spread = spread_want < spread_max ? spread_want : spread_max;
  uint64_t g = tokens;
  if (per_thread > g) g = per_thread;
  if (spread > g) g = spread;
  const uint64_t cap = max_blocks < 1u ? 1u : max_blocks;
  return (uint32_t)(g > cap ? cap : g);
}
/* The launch plan of one rank's call (EarPlan, ear_contract.h): kernel, grid, block and flags of
 * the family `family` (EAR_FAMILY_*, whose launch rules are `rule`: the Rust core describes each
 * family once and hands its rule here) for `op` (EAR_OP_*), from the call alone, so every rank
 * launches the same grid. count: elements of a plain all-reduce; tokens, hidden: rows of the
 * fused op; elem: bytes per element; max_blocks: the group's grid cap (clamped to
 * [1, EAR_MAX_BLOCKS]); facts: what the rank knows of a plain call for its flags (EarCallFacts).
 * The library (layout.c's ear_plan) and the kernel simulations take every launch from here. The
 * switches name every rule and have no default: a rule kind without a case fails the build
 * (-Werror=switch). */
static inline EarPlan ear_plan_of(EarRule rule, int32_t family, int32_t op, uint64_t count, uint64_t tokens,
                                  uint32_t hidden, uint32_t elem, int32_t nranks, uint32_t max_blocks,
                                  EarCallFacts facts) {
  EarPlan p;
  const uint32_t cap = max_blocks < 1u ? 1u : max_blocks > EAR_MAX_BLOCKS ? EAR_MAX_BLOCKS : max_blocks;
  const uint64_t vecs = EAR_CEIL_DIV(count * (uint64_t)elem, EAR_VEC_BYTES);
  p.family = family;
  p.op = op;
  p.flags = 0u;
  p.grid = 1u;
  p.block = EAR_BLOCK_THREADS;
  if (op == EAR_OP_RESIDUAL_RMSNORM) {
    p.block = EAR_FUSED_BLOCK(hidden, elem);
    switch (rule.fused_grid) {
      case EAR_FUSED_GRID_RULE_ROWS: p.grid = EAR_FUSED_GRID(tokens, cap); break;
      case EAR_FUSED_GRID_RULE_LAMPORT: p.grid = ear_fused_lamport_grid_of(tokens, hidden, elem, nranks, cap); break;
    }
    return p;
  }
  switch (rule.grid) {
    case EAR_GRID_RULE_VECS: p.grid = EAR_GRID(vecs, cap); break;
    case EAR_GRID_RULE_SEGMENTS: p.grid = EAR_GRID(EAR_CEIL_DIV(vecs, (uint64_t)(nranks < 1 ? 1 : nranks)), cap); break;
    case EAR_GRID_RULE_LAMPORT:
      p.grid = EAR_LAMPORT_GRID(vecs, cap);
      p.block = EAR_LAMPORT_BLOCK(vecs, cap);
      break;
  }
  if (facts.exchanges_pointers) {
    switch (rule.flags) {
      case EAR_FLAGS_RULE_NONE: break;
      case EAR_FLAGS_RULE_POINTERS_OUT_OF_PLACE:
        p.flags = EAR_CALL_POINTERS | (!facts.in_place && facts.input_reachable ? EAR_CALL_INPUT_SHARED : 0u);
        break;
      case EAR_FLAGS_RULE_POINTERS_ALWAYS:
        p.flags = EAR_CALL_POINTERS | (facts.input_reachable ? EAR_CALL_INPUT_SHARED : 0u);
        break;
    }
  }
  return p;
}

/* The plan of the residual + RMSNorm kernel alone (EAR_FAMILY_NORM) on `tokens` rows of `hidden`:
 * one CTA per row, up to 4 waves of the device's `sm_count` SMs (it waits on nothing, so any grid
 * is right). */
static inline EarPlan ear_norm_plan_of(uint64_t tokens, uint32_t hidden, uint32_t elem, int32_t sm_count) {
  EarPlan p;
  p.family = EAR_FAMILY_NORM;
  p.op = EAR_OP_RESIDUAL_RMSNORM;
  p.flags = 0u;
  p.grid = EAR_FUSED_GRID(tokens, (uint32_t)(sm_count < 1 ? 1 : sm_count) * 4u);
  p.block = EAR_FUSED_BLOCK(hidden, elem);
  return p;
}

/* Staged bytes of a [tokens, hidden] message (one-shot bank, Lamport row, push row). */
#define EAR_FUSED_STAGE_BYTES(tokens, hidden, elem) \
  ((uint64_t)(tokens) * EAR_FUSED_ROW_VECS(hidden, elem) * EAR_VEC_BYTES)
/* Two-shot: each row is cut into n column slices of ceil(row_vecs / n) vectors; rank s owns
 * slice s of every row. Bytes of one stage row / gather segment. */
#define EAR_FUSED_TWOSHOT_SEG_NEED(tokens, hidden, elem, n) \
  ((uint64_t)(tokens) * EAR_CEIL_DIV(EAR_FUSED_ROW_VECS(hidden, elem), (n)) * EAR_VEC_BYTES)
#define EAR_FUSED_ONESHOT_FITS(tokens, hidden, elem, m) \
  (EAR_FUSED_STAGE_BYTES(tokens, hidden, elem) <= (uint64_t)(m))
#define EAR_FUSED_TWOSHOT_FITS(tokens, hidden, elem, m, n) \
  (EAR_FUSED_TWOSHOT_SEG_NEED(tokens, hidden, elem, n) <= EAR_TWOSHOT_SEG_BYTES(m, n))
#define EAR_FUSED_LAMPORT_FITS(tokens, hidden, elem, m) \
  (EAR_FUSED_STAGE_BYTES(tokens, hidden, elem) <= EAR_LAMPORT_MAX_MSG(m))
#define EAR_FUSED_PUSH_FITS(tokens, hidden, elem, m) \
  (EAR_FUSED_STAGE_BYTES(tokens, hidden, elem) <= EAR_PUSH_MAX_MSG(m))

/* The largest plain message of a family whose capacity rule is `rule`, in a workspace made for
 * m bytes. */
static inline uint64_t ear_max_msg_of(EarCapacityRule rule, uint64_t m) {
  switch (rule) {
    case EAR_CAPACITY_RULE_WORKSPACE: return m;
    case EAR_CAPACITY_RULE_LAMPORT: return EAR_LAMPORT_MAX_MSG(m);
    case EAR_CAPACITY_RULE_PUSH: return EAR_PUSH_MAX_MSG(m);
  }
  return 0u;
}

/* Whether `tokens` rows of `hidden` elements of `elem` bytes fit a family whose fused-fit rule is
 * `rule`, in workspaces made for m bytes among n ranks. */
static inline int ear_fused_fits_of(EarFusedFitRule rule, uint64_t tokens, uint32_t hidden, uint32_t elem, uint64_t m,
                                    uint64_t n) {
  switch (rule) {
    case EAR_FUSED_FIT_RULE_ONESHOT: return EAR_FUSED_ONESHOT_FITS(tokens, hidden, elem, m);
    case EAR_FUSED_FIT_RULE_TWOSHOT: return EAR_FUSED_TWOSHOT_FITS(tokens, hidden, elem, m, n);
    case EAR_FUSED_FIT_RULE_LAMPORT: return EAR_FUSED_LAMPORT_FITS(tokens, hidden, elem, m);
    case EAR_FUSED_FIT_RULE_PUSH: return EAR_FUSED_PUSH_FITS(tokens, hidden, elem, m);
  }
  return 0;
}

/* EarFusedParams (ear_contract.h) is the only argument of the fused kernels, by value. */
#ifdef __cplusplus
static_assert(sizeof(EarFusedParams) == 256, "EarFusedParams must be 256 bytes");
#else
_Static_assert(sizeof(EarFusedParams) == 256, "EarFusedParams must be 256 bytes");
#endif

#endif /* EAR_ALLREDUCE_PARAMS_H */
