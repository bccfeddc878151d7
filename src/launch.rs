//! The launcher: for a family chosen by `crate::strategy`, whether it takes a message, its
//! kernel, grid and block ([`crate::family`]'s rules), its parameter block
//! ([`crate::contract`]), and `cuLaunchKernelEx` on TensorRT's stream ([`crate::cuda::launch`]).
//! The grid and block depend only on the call, so every rank launches the same grid.

use crate::contract::{EarAllReduceParams, EarFusedParams, EAR_CALL_INPUT_SHARED, EAR_CALL_POINTERS};
use crate::cuda::{self, DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::family::{self, Family, Op};
use crate::group::Group;
use crate::kernels::DeviceKernels;
use crate::link::LinkClass;
use crate::tensor::DataType;

/// A message as the kernels see it: its bytes, and for the fused op its rows.
#[derive(Clone, Copy, Debug)]
pub struct Message {
    pub bytes: u64,
    /// `(tokens, hidden)` of a fused all-reduce + residual + RMSNorm; None for a plain sum.
    pub rows: Option<(u64, u32)>,
}

/// What the custom kernels can do for a call: implemented by [`Group`], and by fakes in tests.
pub trait Fits {
    fn nranks(&self) -> i32;
    /// Whether `family` has a kernel for this group, `dtype` and the message's op, and takes it.
    fn serves(&self, family: Family, dtype: DataType, message: &Message) -> bool;
    /// What carries the bytes between the ranks (`crate::link`): AUTO keeps a table per class
    /// (`crate::strategy`). NVLink unless said otherwise (the tables measured first).
    fn link_class(&self) -> LinkClass {
        LinkClass::NvLink
    }
}

impl Fits for Group {
    fn nranks(&self) -> i32 {
        self.nranks
    }
    fn link_class(&self) -> LinkClass {
        if self.one_device() {
            LinkClass::SameDevice
        } else {
            self.links
        }
    }
    fn serves(&self, family: Family, dtype: DataType, message: &Message) -> bool {
        let fits = match message.rows {
            None => family.fits(message.bytes, self.max_bytes),
            Some((tokens, hidden)) => family.fused_fits(tokens, hidden, dtype.size(), self.max_bytes, self.nranks),
        };
        let op = if message.rows.is_some() { Op::ResidualRmsNorm } else { Op::AllReduce };
        fits && self.kernels().is_some_and(|k| k.function(family, op, dtype, self.nranks).is_some())
    }
}

/// The tensors of one fused all-reduce + residual (+ bias) + RMSNorm.
#[derive(Clone, Copy, Debug)]
pub struct FusedCall {
    pub x: DevicePtr,
    pub residual: DevicePtr,
    /// NULL: no bias.
    pub bias: DevicePtr,
    pub gamma: DevicePtr,
    pub residual_out: DevicePtr,
    pub normed: DevicePtr,
    pub tokens: u64,
    pub hidden: u32,
    pub eps: f32,
}

impl FusedCall {
    fn params(&self, ar: EarAllReduceParams) -> EarFusedParams {
        EarFusedParams {
            ar,
            residual: self.residual.as_const(),
            bias: self.bias.as_const(),
            gamma: self.gamma.as_const(),
            residual_out: self.residual_out.as_mut(),
            normed: self.normed.as_mut(),
            tokens: self.tokens,
            hidden: self.hidden,
            eps: self.eps,
        }
    }

    /// Residual + bias + RMSNorm alone, on `x_reduced` (already summed by NCCL, or one rank),
    /// with `kernels` of the current device.
    ///
    /// # Safety
    /// Every address must be a 16-byte aligned device buffer of the current device of the
    /// described size; `x_reduced` may equal `normed`.
    pub unsafe fn launch_norm(&self, kernels: &DeviceKernels, dtype: DataType, x_reduced: DevicePtr, stream: Stream) -> Result<()> {
        let f = kernels.norm(dtype).ok_or_else(|| Error::NoKernel(family::norm_kernel_name(dtype)))?;
        // The kernel reads only ar.input and ar.count of `ar`.
        let ar = EarAllReduceParams {
            peer_ws: [std::ptr::null_mut(); crate::contract::EAR_MAX_RANKS],
            state: std::ptr::null_mut(),
            input: x_reduced.as_const(),
            output: std::ptr::null_mut(),
            count: self.tokens * self.hidden as u64,
            ws_max_bytes: 0,
            rank: 0,
            nranks: 0,
            fault: std::ptr::null_mut(),
            timeout_ns: 0,
            generation: 0,
            flags: 0,
        };
        let (grid, block) = family::norm_grid_block(self.tokens, self.hidden, dtype.size(), kernels.sm_count);
        // SAFETY: the caller's buffers, the kernel's own parameter block.
        unsafe { cuda::launch(f, grid, block, stream, &self.params(ar), kernels.pdl) }
    }
}

impl Group {
    /// Whether every rank is on one device (simulated ranks): then that device's memory, not
    /// the links between GPUs, carries every byte.
    fn one_device(&self) -> bool {
        let device = self.members.first().and_then(Option::as_ref).map(|m| m.device);
        device.is_some() && self.members.iter().all(|m| m.as_ref().map(|m| m.device) == device)
    }

    /// Whether `family` has a plain all-reduce kernel for this group and `dtype`, and takes `bytes`.
    pub fn serves_bytes(&self, family: Family, dtype: DataType, bytes: u64) -> bool {
        self.serves(family, dtype, &Message { bytes, rows: None })
    }

    /// Rank `rank`'s kernels and its part of the parameters of one call; refused once the group
    /// is retired or has a fault (its kernels would do nothing).
    fn rank_params(&self, rank: i32, input: DevicePtr, output: DevicePtr, count: u64) -> Result<(&DeviceKernels, EarAllReduceParams)> {
        let member = self.member(rank)?;
        if self.is_retired() {
            return Err(Error::Released);
        }
        if let Some(fault) = self.fault() {
            return Err(Error::GroupFault { device: member.device, why: fault.describe() });
        }
        let params = EarAllReduceParams {
            peer_ws: self.peer_ws.map(DevicePtr::as_mut),
            state: member.state.ptr().as_mut(),
            input: input.as_const(),
            output: output.as_mut(),
            count,
            ws_max_bytes: self.max_bytes,
            rank,
            nranks: self.nranks,
            fault: member.fault.as_mut().cast(),
            timeout_ns: self.timeout_ns,
            generation: self.generation,
            flags: 0,
        };
        Ok((&member.kernels, params))
    }

    /// Whether the ranks of a 4+ rank one-shot or two-shot tell each other where their inputs
    /// are (`EAR_CALL_POINTERS`): the group lives in this process (one address space, so a
    /// peer can read a rank's input where it lies), every rank's kernels have the 16-byte
    /// atomics of the exchange (code from compute_90 or newer), and the links between its
    /// devices carry them (`Group::links_exchange`). It depends on the group only, so every
    /// rank of a call gives the same answer, as the flag requires.
    fn exchanges_pointers(&self) -> bool {
        self.nranks >= 4
            && self.links_exchange
            && self.members.iter().all(|m| m.as_ref().is_some_and(|m| m.kernels.sm90_code))
    }

    /// Whether every rank may read `input` (on `device`) in place, in a group that exchanges
    /// pointers: `input` is device memory every rank's device reaches: any of that device's
    /// memory when all ranks share it (simulated ranks), else a plain cuMemAlloc allocation of
    /// the device's primary context, which the peer access of [`Group::in_process`] reaches as
    /// it reaches the workspaces (pool and VMM allocations need grants of their own: those are
    /// copied). Asked of the driver per call (`cuPointerGetAttributes`), only where the answer
    /// is read.
    fn input_shared(&self, device: i32, input: DevicePtr) -> bool {
        peers_reach(device, self.one_device(), cuda::device_memory(input))
    }

    /// Enqueues rank `rank`'s part of one all-reduce on `stream` (a stream of that rank's device).
    ///
    /// # Safety
    /// `input` and `output` must be 16-byte aligned device buffers of `count` elements on the
    /// rank's device, and every rank of the group must enqueue the same call (family, dtype,
    /// count) in the same order.
    #[allow(clippy::too_many_arguments)] // one call's operands, as enqueue receives them
    pub unsafe fn launch(&self, rank: i32, family: Family, dtype: DataType, input: DevicePtr, output: DevicePtr, count: usize, stream: Stream) -> Result<()> {
        let (kernels, mut params) = self.rank_params(rank, input, output, count as u64)?;
        let device = self.member(rank)?.device;
        params.flags = call_flags(family, self.exchanges_pointers(), input == output, || self.input_shared(device, input));
        let op = Op::AllReduce;
        let f = kernels.function(family, op, dtype, self.nranks).ok_or_else(|| Error::NoKernel(family::kernel_name(family, op, dtype, self.nranks)))?;
        let vecs = (params.count * dtype.size() as u64).div_ceil(16);
        let (grid, block) = family.grid_block(vecs, self.nranks, self.max_blocks);
        // SAFETY: the caller's buffers; the workspaces and state block are the group's, alive
        // while `self` is.
        unsafe { cuda::launch(f, grid, block, stream, &params, kernels.pdl) }
    }

    /// Enqueues rank `rank`'s part of one fused all-reduce + residual + RMSNorm.
    ///
    /// # Safety
    /// As [`Group::launch`], for every tensor of `call`.
    pub unsafe fn launch_fused(&self, rank: i32, family: Family, dtype: DataType, call: &FusedCall, stream: Stream) -> Result<()> {
        let (kernels, ar) = self.rank_params(rank, call.x, DevicePtr::NULL, call.tokens * call.hidden as u64)?;
        let op = Op::ResidualRmsNorm;
        let f = kernels.function(family, op, dtype, self.nranks).ok_or_else(|| Error::NoKernel(family::kernel_name(family, op, dtype, self.nranks)))?;
        let (grid, block) = family.fused_grid_block(call.tokens, call.hidden, dtype.size(), self.max_blocks);
        // SAFETY: as in launch.
        unsafe { cuda::launch(f, grid, block, stream, &call.params(ar), kernels.pdl) }
    }
}

/// `EarAllReduceParams::flags` of one rank's call of `family`: the 4+ rank one-shot and two-shot
/// of a group that exchanges pointers ([`Group::exchanges_pointers`]) say so on every rank, and
/// let peers read their input in place where `reachable` ([`Group::input_shared`], asked only
/// then) says they can: the two-shot even in place (`output == input`: peers read our input
/// only before we write outside our own segment), the one-shot only out of place (it writes
/// its output while peers still read). Other families read no flag.
fn call_flags(family: Family, exchanges: bool, in_place: bool, reachable: impl FnOnce() -> bool) -> u32 {
    if !exchanges || !matches!(family, Family::OneShot | Family::TwoShot) {
        return 0;
    }
    let may_share = family == Family::TwoShot || !in_place;
    EAR_CALL_POINTERS | if may_share && reachable() { EAR_CALL_INPUT_SHARED } else { 0 }
}

/// The rule of [`Group::input_shared`] for a group of one process, given where the input lies
/// ([`cuda::device_memory`]: its device, and whether the peer access between primary contexts
/// reaches it): on the rank's own device, and reachable, or every rank on that device.
fn peers_reach(device: i32, one_device: bool, memory: Option<(i32, bool)>) -> bool {
    memory.is_some_and(|(at, reachable)| at == device && (reachable || one_device))
}

#[cfg(test)]
mod tests {
    use super::{call_flags, peers_reach};
    use crate::contract::{EAR_CALL_INPUT_SHARED, EAR_CALL_POINTERS};
    use crate::family::Family;

    #[test]
    fn only_groups_that_exchange_pointers_read_inputs_in_place() {
        let both = EAR_CALL_POINTERS | EAR_CALL_INPUT_SHARED;
        assert_eq!(call_flags(Family::OneShot, true, false, || true), both);
        assert_eq!(call_flags(Family::OneShot, true, true, || panic!("not asked in place")), EAR_CALL_POINTERS, "the one-shot in place copies");
        assert_eq!(call_flags(Family::TwoShot, true, true, || true), both, "the two-shot may share in place");
        assert_eq!(call_flags(Family::TwoShot, true, false, || false), EAR_CALL_POINTERS, "unreachable memory: copied, pointers still exchanged");
        assert_eq!(call_flags(Family::OneShot, false, false, || panic!("no exchange, no question")), 0);
        assert_eq!(call_flags(Family::Lamport, true, false, || panic!("Lamport reads no flag")), 0);
    }

    #[test]
    fn peers_read_an_input_in_place_only_where_they_reach_it() {
        assert!(peers_reach(1, false, Some((1, true))), "a cuMemAlloc allocation of the primary context, separate GPUs");
        assert!(!peers_reach(1, false, Some((1, false))), "pool, VMM or another context's memory on separate GPUs: copied");
        assert!(peers_reach(0, true, Some((0, false))), "simulated ranks: any memory of the one device");
        assert!(!peers_reach(1, false, Some((0, true))), "memory of another device than the rank's");
        assert!(!peers_reach(0, true, None), "host memory, or a pointer the driver does not know");
    }
}
