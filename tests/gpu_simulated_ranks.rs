//! The custom all-reduce through the library's own launch path (`Group::launch`, the embedded
//! kernels, the launch rule), on N simulated ranks on one GPU: N workspaces on the device, each
//! rank on its own stream, grids capped so all ranks are co-resident. Needs a GPU, so it is
//! `#[ignore]`d: `cargo test -- --ignored` (tools/gpu/device_session.sh runs the compiled binary
//! with `--ignored` on the H200), where it fails if there is no GPU.

use cudarc::driver::{CudaStream, DevicePtr as _};
use edgellm_allreduce::{DataType, DevicePtr, Family, Group, Stream};
use edgellm_test_support::{check_output, generate};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{gpu, Watchdog};

/// One all-reduce on every rank of `group`; returns each rank's output bytes.
fn all_reduce(
    group: &Group,
    streams: &[Arc<CudaStream>],
    family: Family,
    dtype: DataType,
    inputs: &[Vec<u8>],
    in_place: bool,
) -> Vec<Vec<u8>> {
    let count = inputs[0].len() / dtype.size();
    let bufs: Vec<_> = inputs.iter().zip(streams).map(|(h, s)| s.clone_htod(h).unwrap()).collect();
    let outs: Vec<_> = streams.iter().map(|s| s.clone_htod(&vec![0xffu8; inputs[0].len()]).unwrap()).collect();
    for s in streams {
        s.synchronize().unwrap();
    }
    for (rank, s) in streams.iter().enumerate() {
        let (input, _) = bufs[rank].device_ptr(s);
        let (output, _) = if in_place { bufs[rank].device_ptr(s) } else { outs[rank].device_ptr(s) };
        let (input, output, stream) = (DevicePtr(input), DevicePtr(output), Stream(s.cu_stream() as usize));
        // SAFETY: device buffers of `count` elements, 16-byte aligned (fresh allocations); every
        // rank launches the same call.
        unsafe { group.launch(rank as i32, family, dtype, input, output, count, stream) }.unwrap();
    }
    streams
        .iter()
        .enumerate()
        .map(|(rank, s)| {
            s.synchronize().unwrap();
            s.clone_dtoh(if in_place { &bufs[rank] } else { &outs[rank] }).unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn every_family_type_and_rank_count_on_simulated_ranks() {
    let ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(240));
    let mut passed = 0;
    for nranks in [2, 4, 8] {
        let group = Group::simulated(0, nranks, 16 << 20).unwrap();
        let streams: Vec<_> = (0..nranks).map(|_| ctx.new_stream().unwrap()).collect();
        for dtype in [DataType::Float, DataType::Half, DataType::Bf16] {
            for family in Family::ALL {
                for (i, count) in [1usize, 7, 1000, 4097, (1 << 20) + 3, 4 << 20].into_iter().enumerate() {
                    let bytes = (count * dtype.size()) as u64;
                    if !group.serves_bytes(family, dtype, bytes) {
                        continue;
                    }
                    let in_place = i % 2 == 1;
                    watchdog.at(format!("{family:?} {dtype:?} n={nranks} count={count} in_place={in_place}"));
                    // fp64 sum of the stored inputs, in rank order.
                    let mut reference = vec![0f64; count];
                    let inputs: Vec<_> = (0..nranks)
                        .map(|r| generate(count, dtype, (r as u64 + 1) * 7919 + count as u64, Some(&mut reference)))
                        .collect();
                    let outputs = all_reduce(&group, &streams, family, dtype, &inputs, in_place);
                    for (rank, out) in outputs.iter().enumerate() {
                        assert!(
                            out == &outputs[0],
                            "rank {rank} differs from rank 0: {family:?} {dtype:?} n={nranks} count={count}"
                        );
                    }
                    let check = check_output(&outputs[0], &reference, dtype);
                    assert!(
                        check.first_bad.is_none(),
                        "unwritten or non-finite output at {:?}: {family:?} {dtype:?} n={nranks} count={count}",
                        check.first_bad
                    );
                    assert!(
                        check.rel_err < check.tolerance,
                        "relative error {:e}: {family:?} {dtype:?} n={nranks} count={count}",
                        check.rel_err
                    );
                    passed += 1;
                }
            }
        }
    }
    println!("simulated ranks: {passed} cases passed");
    assert!(passed >= 100, "only {passed} cases ran");
}
