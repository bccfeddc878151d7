// oneshot.cu: one-shot all-reduce, pull flavour, one flag barrier per call, two when inputs
// are read in place (ear_oneshot_barrier_<t>_n<N>).
//
// Protocol (call number seq = State::seq, identical on every rank):
//   layout   own bank = data region + EAR_OFF_ONESHOT + (seq % 2) * EAR_ONESHOT_BANK_BYTES(m),
//            a copy of our whole input, vector i at byte 16*i.
//   1. stage  every CTA b copies its vectors (i = b*512 + t, grid-stride) of our input into
//             our own bank (local writes). Skipped when peers read our input in place (ranks
//             of one process, EAR_CALL_POINTERS and EAR_CALL_INPUT_SHARED, output !=
//             input).
//   2. barrier cta_barrier(flag_value(seq, 0)): CTA b of every rank has staged its vectors.
//             With EAR_CALL_POINTERS, cta_barrier_sharing: each rank also says where its
//             vectors are, its input or its bank (sync.cuh).
//   3. reduce CTA b loads the SAME vectors from every rank, where it said (N-1 NVLink reads),
//             sums them in rank order 0..N-1 in fp32, writes our output.
//   4. done   only when some rank's input was read in place: cta_inputs_done(flag_value(seq,
//             1)): each CTA tells every peer it read in place that it is done with its input,
//             and a CTA whose input peers read waits until each has said so, so that a call
//             never completes while a peer still reads its input.
//   (begin_call advances seq for the next call; see State in common.cuh.)
//   Who writes what: rank r writes only its own bank and peers' signal slots; peers only
//   read rank r's bank or input. Each thread reads in step 3 exactly the vectors the same-
//   index thread of every rank wrote in step 1, so the per-CTA barrier is enough; the same
//   thread reads input i before writing output i, so in-place is safe (and then the input
//   is copied, never read by peers).
//
// Why bank reuse is safe without an exit barrier: call seq writes bank seq % 2, which was
// last read by peers in call seq-2. Rank r starts call seq only after its call seq-1 has
// completed (stream order, or griddepcontrol.wait under PDL), and a call of any family
// completes on a rank only after every peer has started it (it waits, in a barrier or a
// poll, on something every peer writes in that call: see each family), which a peer does
// only after its call seq-2 has completed. So no peer still reads the bank, whatever the
// family and the grid of each call in between.
//
// Cost per rank: local copy S (none in place), (N-1)*S NVLink reads, one flag round trip (two
// in place).
#include "common.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void oneshot_barrier_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, p.ws_max_bytes);
  const uint64_t* const our_abort = open_call<T>(p);
  const CallCounters c = begin_call(p, our_abort, next_barrier_call);
  const uint64_t m = p.ws_max_bytes;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t bank_off =
      EAR_OFF_ONESHOT(m, N) + (c.seq & 1u) * EAR_ONESHOT_BANK_BYTES(m);
  char* own_bank = data_region(peer_base<N>(p, p.rank)) + bank_off;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool pointers = exchanges_pointers<N>(p);
  // Not in place (output == input): we write our output while peers may still read our input.
  const bool shared_input = shares_input<N>(p, p.output != p.input);

  if (!shared_input)
    batched_for<kCopyBatch>(
        first, stride, vecs, [&](uint64_t i) { return load_input<T>(p.input, i, p.count); },
        [&](uint64_t i, const uint4& v) { st_vec(own_bank + i * 16, v); });

  const auto reduce_into_output = [&](const auto& load) {
    batched_for<kReduceBatch<N>>(first, stride, vecs, load, [&](uint64_t i, const Ranks<N>& v) {
      store_output<T>(p.output, i, p.count, reduce_in_rank_order<T, N>(v.v));
    });
  };
  if (!pointers) {  // every rank's vectors are in its bank
    cta_barrier<N>(p, flag_value(c.seq, 0));
    const char* banks[N];
#pragma unroll
    for (int r = 0; r < N; ++r) banks[r] = data_region(p.peer_ws[r]) + bank_off;
    reduce_into_output([&](uint64_t i) {
      Ranks<N> v;
#pragma unroll
      for (int r = 0; r < N; ++r) v.v[r] = ld_cg(banks[r] + i * 16);
      return v;
    });
  } else {
    // Where each rank's vectors are: its input read in place (theirs; ours when shared), else
    // its bank.
    __shared__ const void* theirs[N];
    cta_barrier_sharing<N>(p, flag_value(c.seq, 0), shared_input ? p.input : nullptr, theirs);
    const void* from[N];
    bool read_in_place = false;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const void* const in_place = r == p.rank ? (shared_input ? p.input : nullptr) : theirs[r];
      from[r] = in_place != nullptr ? in_place : data_region(p.peer_ws[r]) + bank_off;
      read_in_place |= r != p.rank && in_place != nullptr;
    }
    reduce_into_output([&](uint64_t i) { return load_ranks_cg<T, N>(from, i, p.count); });
    // theirs[] and shared_input are the same for every thread of the CTA: a uniform branch.
    if (shared_input || read_in_place) cta_inputs_done<N>(p, flag_value(c.seq, 1), shared_input, theirs);
  }
  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_KERNEL, oneshot_barrier, ear::oneshot_barrier_body)
