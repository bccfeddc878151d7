// push.cuh: what the staged push kernels share (push.cu, push_norm.cu; the protocol and why it
// is safe: the top of push.cu): where a source's row lies in a reader's push region, and the N-1
// passes that fill our row at every peer.
#pragma once

#include "memory.cuh"
#include "sync.cuh"
#include "vectors.cuh"

namespace ear {

// Rank `src`'s row of parity `par` in the push region of the rank whose workspace is `ws`
// (that rank is `reader`).
template <int N>
__device__ __forceinline__ char* push_row(void* ws, uint64_t m, uint64_t par, int src, int reader) {
  return data_region(ws) + EAR_OFF_PUSH(m, N) + EAR_PUSH_ROW(par, src, reader, N) * EAR_PUSH_ROW_BYTES(m);
}
// The first row of parity `par` in the push region of workspace `ws`: the reader's row of rank
// src is row src - (src > reader) after it. The reduce indexes from it per use: with a push_row
// per rank the fused kernel at N = 16 spilled 288 bytes, with this 96 (sm_90).
template <int N>
__device__ __forceinline__ const char* push_rows(void* ws, uint64_t m, uint64_t par) {
  return data_region(ws) + EAR_OFF_PUSH(m, N) + EAR_PUSH_ROW(par, 0, 0, N) * EAR_PUSH_ROW_BYTES(m);
}

// The passes of call `seq`, every thread of the CTA: in pass k (1..N-1), store(row) writes the
// CTA's share of our data into `row`, our row at dst = rank + k (mod N), then cta_handoff
// publishes flag_value(seq, k - 1) to dst and waits for the same value from src = rank - k (mod
// N), the rank whose pass k writes to us. A CTA with nothing to store still takes every pass:
// its peers' same-index CTAs wait for its flags. Not unrolled: N-1 copies of the store loop.
template <int N, typename Store>
__device__ __forceinline__ void push_passes(const EarAllReduceParams& p, uint64_t seq, Store store) {
  const int rank = p.rank;
#pragma unroll 1
  for (int k = 1; k < N; ++k) {
    const int dst = rank + k < N ? rank + k : rank + k - N;
    const int src = rank >= k ? rank - k : rank - k + N;
    store(push_row<N>(peer_base<N>(p, dst), p.ws_max_bytes, seq & 1u, rank, dst));
    cta_handoff<N>(p, dst, src, flag_value(seq, static_cast<uint32_t>(k - 1)));
  }
}

}  // namespace ear
