//! One call on one rank: [`plan_call`] gathers what the rank knows (its device's registration
//! and group, a fault since the last call, the stream's claim on the rank, where the input
//! lies), asks `crate::launch::plan::plan` for the call's whole plan, and resolves its kernels
//! into launches ([`CallPlan`]); [`CallPlan::run`] executes it. The plugin's enqueue
//! (`crate::plugin`) does nothing else.

use super::{device, Group};
use crate::contract::{EarAllReduceParams, EarCallFacts, EarPlan};
use crate::cuda::{self, DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::launch::family::{self, Family, Op};
use crate::launch::kernels::DeviceKernels;
use crate::launch::launcher::Launch;
use crate::launch::plan::{self, Facts};
use crate::launch::strategy::{self, Call, Decision, Requested};
use crate::launch::{Fits, FusedCall, Message};
use crate::link::LinkClass;
use crate::nccl::{self, Registration};
use crate::tensor::DataType;
use std::sync::Arc;

/// The tensors of one call, as TensorRT hands them to enqueue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tensors {
    /// A plain all-reduce of `count` elements.
    Sum { input: DevicePtr, output: DevicePtr, count: u64 },
    /// The fused all-reduce + residual (+ bias) + RMSNorm.
    Fused(FusedCall),
}

impl Tensors {
    /// What a plain sum reads and writes: the input and output, or for the fused op x summed
    /// into `normed` (which the norm kernel then reads and overwrites in place).
    fn sum_operands(&self) -> (DevicePtr, DevicePtr, u64) {
        match *self {
            Tensors::Sum { input, output, count } => (input, output, count),
            Tensors::Fused(c) => (c.x, c.normed, c.tokens * c.hidden as u64),
        }
    }
}

/// One rank's plan of one call, its kernels resolved.
pub(crate) struct CallPlan {
    pub(crate) decision: Decision,
    dtype: DataType,
    registration: Registration,
    /// The family's kernel, on the group and this device's rank in it (`Custom`, `Split`).
    kernel: Option<(Arc<Group>, i32, Launch, EarPlan)>,
    /// The residual + RMSNorm kernel after a plain sum (the fused op on NCCL or split), on
    /// these kernels of the device (loaded at configure time).
    norm: Option<(Arc<DeviceKernels>, EarPlan)>,
}

/// Plans `call` on `device` (the current device) on `stream`: the device's registration and
/// group in one lookup (a fault found since the last call fails the group and this call), the
/// plan for the facts, and, when it runs the group's kernel, the stream's claim on the rank
/// (another stream: planned again, NCCL).
pub(crate) fn plan_call(
    device: i32,
    requested: Requested,
    call: &Call,
    tensors: &Tensors,
    stream: Stream,
) -> Result<CallPlan> {
    let (registration, group) = device::for_call(device, call.tp_size)?;
    if let Some((g, _)) = &group {
        // A kernel of the group gave up (or found it aborted) since the last call: that call's
        // output was wrong. Its devices fail from now on (`super::formation` says why).
        if let Some(fault) = g.fault() {
            device::fail(device, g, fault);
            return Err(Error::GroupFault { device, why: fault.describe() });
        }
    }
    let sm_count = match call.message.rows {
        Some(_) => device::kernels(device)?.sm_count,
        None => 0,
    };
    let facts = |stream_owns_rank| Facts {
        group: group.as_ref().map(|(g, _)| &**g as &dyn Fits),
        max_blocks: group.as_ref().map_or(1, |(g, _)| g.max_blocks),
        stream_owns_rank,
        call: group.as_ref().map_or_else(EarCallFacts::default, |(g, _)| g.call_facts(device, tensors)),
        sm_count,
    };
    let tuned = crate::launch::tuning::active();
    let mut planned = plan::plan(requested, call, &facts(true), tuned);
    if let (Some(_), Some((g, rank))) = (planned.kernel, &group) {
        if !g.claim_stream(*rank, stream) {
            planned = plan::plan(requested, call, &facts(false), tuned);
        }
    }
    let kernel = match (planned.kernel, group) {
        (Some((family, p)), Some((g, rank))) => Some((g.launch_of(rank, family, call.dtype, &p)?, g, rank, p)),
        _ => None,
    }
    .map(|(launch, g, rank, p)| (g, rank, launch, p));
    let norm = match planned.norm {
        Some(p) => Some((device::kernels(device)?, p)),
        None => None,
    };
    Ok(CallPlan { decision: planned.decision, dtype: call.dtype, registration, kernel, norm })
}

impl CallPlan {
    /// Launches the plan on `stream`: the family's kernel (the group then held by a CUDA graph
    /// that captures it) or NCCL, then the norm kernel where the plan has one.
    ///
    /// # Safety
    /// `tensors` are the ones planned: device buffers of the current device of the checked
    /// shapes, 16-byte aligned, on `stream`; every rank of the group runs the same call (family,
    /// dtype, count) in the same order (the plan is a function of what they share).
    pub(crate) unsafe fn run(&self, tensors: &Tensors, stream: Stream) -> Result<()> {
        let (input, output, count) = tensors.sum_operands();
        match &self.kernel {
            Some((group, rank, launch, p)) => {
                // SAFETY: the caller's contract.
                unsafe { group.run(*rank, launch, p, tensors, stream)? };
                group.hold_for_capture(stream)?;
            }
            // SAFETY: the runtime registered a live communicator and ncclAllReduce for this
            // device; the buffers hold `count` elements, on `stream`.
            None => unsafe { nccl::all_reduce(self.registration, input, output, count as usize, self.dtype, stream)? },
        }
        match (&self.norm, tensors) {
            // SAFETY: x was summed into `normed`, which the norm reads and overwrites in place.
            (Some((kernels, p)), Tensors::Fused(c)) => unsafe { c.run_norm(kernels, self.dtype, p, c.normed, stream) },
            _ => Ok(()),
        }
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
    fn pulls(&self) -> bool {
        self.pulls
    }
    fn serves(&self, family: Family, dtype: DataType, message: &Message) -> bool {
        let fits = match message.rows {
            None => family.fits(message.bytes, self.max_bytes),
            Some((tokens, hidden)) => family.fused_fits(tokens, hidden, dtype.size(), self.max_bytes, self.nranks),
        };
        fits && self.kernels().is_some_and(|k| k.function(family, plan::op(message), dtype, self.nranks).is_some())
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

    /// Rank `rank`'s launch of `family`'s kernel planned as `p`. Refused once the group is
    /// retired or has a fault (its kernels would do nothing).
    pub(crate) fn launch_of(&self, rank: i32, family: Family, dtype: DataType, p: &EarPlan) -> Result<Launch> {
        let member = self.member(rank)?;
        if self.is_retired() {
            return Err(Error::Released);
        }
        if let Some(fault) = self.fault() {
            return Err(Error::GroupFault { device: member.device, why: fault.describe() });
        }
        let op = plan::op_of(p);
        let function = member
            .kernels
            .function(family, op, dtype, self.nranks)
            .ok_or_else(|| Error::NoKernel(family::kernel_name(family, op, dtype, self.nranks)))?;
        Ok(Launch::planned(function, p, member.kernels.pdl))
    }

    /// What the flags of rank `rank`'s plain sum on `tensors` depend on (on `device`): whether the
    /// group exchanges pointers, and then whether the sum is in place and its input where peers
    /// reach it (asked of the driver only then).
    fn call_facts(&self, device: i32, tensors: &Tensors) -> EarCallFacts {
        if !self.exchanges_pointers() {
            return EarCallFacts::default();
        }
        let (input, output, _) = tensors.sum_operands();
        // Where the input lies: a cuMemAlloc allocation of the device's primary context is what
        // the peer access between primary contexts reaches.
        let primary = device::context(device).ok();
        let memory = cuda::device_memory(input).map(|m| (m.device, m.plain && Some(m.context) == primary));
        let reachable = plan::peers_reach(device, self.one_device(), memory);
        EarCallFacts {
            exchanges_pointers: 1,
            in_place: (input == output) as u8,
            input_reachable: reachable as u8,
            reserved: 0,
        }
    }

    /// Launches rank `rank`'s kernel, planned as `p`, on `tensors`.
    ///
    /// # Safety
    /// As [`CallPlan::run`]; `launch` and `p` are this group's plan for these tensors.
    pub(crate) unsafe fn run(
        &self,
        rank: i32,
        launch: &Launch,
        p: &EarPlan,
        tensors: &Tensors,
        stream: Stream,
    ) -> Result<()> {
        let (input, output, count) = tensors.sum_operands();
        match tensors {
            // The fused kernels read ar.input (x) and write normed and residual_out themselves.
            Tensors::Fused(c) if plan::op_of(p) == Op::ResidualRmsNorm => {
                let ar = self.params(rank, input, DevicePtr::NULL, count, p.flags)?;
                // SAFETY: the caller's buffers; the workspaces and state block are the group's,
                // alive while `self` is.
                unsafe { launch.run(&c.params(ar), stream) }
            }
            _ => {
                let ar = self.params(rank, input, output, count, p.flags)?;
                // SAFETY: as above.
                unsafe { launch.run(&ar, stream) }
            }
        }
    }

    /// Rank `rank`'s part of the parameters of one call.
    fn params(
        &self,
        rank: i32,
        input: DevicePtr,
        output: DevicePtr,
        count: u64,
        flags: u32,
    ) -> Result<EarAllReduceParams> {
        let member = self.member(rank)?;
        Ok(EarAllReduceParams {
            peer_ws: self.peer_ws.map(DevicePtr::as_mut),
            state: member.state.ptr().as_mut(),
            input: input.as_const(),
            output: output.as_mut(),
            count,
            ws_max_bytes: self.max_bytes,
            rank,
            nranks: self.nranks,
            fault: member.fault.ptr().as_mut().cast(),
            timeout_ns: self.timeout_ns,
            generation: self.generation,
            flags,
        })
    }

    /// Whether the ranks of a one-shot or a 4+ rank two-shot tell each other where their inputs
    /// are (`EAR_CALL_POINTERS`): the group lives in this process (one address space, so a
    /// peer can read a rank's input where it lies), every rank's kernels have the 16-byte
    /// atomics of the exchange (code from compute_90 or newer), and the links between its
    /// devices carry them (`Group::links_exchange`). It depends on the group only, so every
    /// rank of a call gives the same answer, as the flag requires.
    fn exchanges_pointers(&self) -> bool {
        self.links_exchange && self.members.iter().all(|m| m.as_ref().is_some_and(|m| m.kernels.sm90_code))
    }

    /// Enqueues rank `rank`'s part of one all-reduce on `stream` (a stream of that rank's
    /// device), planned as the library plans it (benchmarks and tests).
    ///
    /// # Safety
    /// `input` and `output` must be 16-byte aligned device buffers of `count` elements on the
    /// rank's device, and every rank of the group must enqueue the same call (family, dtype,
    /// count) in the same order.
    #[allow(clippy::too_many_arguments)] // one call's operands, as enqueue receives them
    pub unsafe fn launch(
        &self,
        rank: i32,
        family: Family,
        dtype: DataType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        stream: Stream,
    ) -> Result<()> {
        let (tensors, message) = sum_call(dtype, input, output, count);
        // SAFETY: the caller's contract.
        unsafe { self.launch_message(rank, family, dtype, &message, &tensors, stream, None) }
    }

    /// [`Group::launch`] with at most `ctas` CTAs (within the group's cap) instead of the
    /// family's cap on the group's links: `edgellm-allreduce-bench tune` measures grids. Every
    /// rank must launch the call with the same `ctas`.
    ///
    /// # Safety
    /// As [`Group::launch`].
    #[allow(clippy::too_many_arguments)] // one call's operands and its grid
    pub unsafe fn launch_with_ctas(
        &self,
        rank: i32,
        family: Family,
        dtype: DataType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        stream: Stream,
        ctas: u32,
    ) -> Result<()> {
        let (tensors, message) = sum_call(dtype, input, output, count);
        // SAFETY: the caller's contract.
        unsafe { self.launch_message(rank, family, dtype, &message, &tensors, stream, Some(ctas)) }
    }

    /// Enqueues rank `rank`'s part of one fused all-reduce + residual + RMSNorm.
    ///
    /// # Safety
    /// As [`Group::launch`], for every tensor of `call`.
    pub unsafe fn launch_fused(
        &self,
        rank: i32,
        family: Family,
        dtype: DataType,
        call: &FusedCall,
        stream: Stream,
    ) -> Result<()> {
        let tensors = Tensors::Fused(*call);
        let message = Message {
            bytes: call.tokens * call.hidden as u64 * dtype.size() as u64,
            rows: Some((call.tokens, call.hidden)),
        };
        // SAFETY: the caller's contract.
        unsafe { self.launch_message(rank, family, dtype, &message, &tensors, stream, None) }
    }

    /// [`Group::launch`] and [`Group::launch_fused`]: `family`'s kernel for `message` on
    /// `tensors`, planned by the library's rule, with at most `ctas` CTAs (None: the family's cap
    /// on the group's links, as AUTO runs it).
    ///
    /// # Safety
    /// As [`Group::launch`].
    #[allow(clippy::too_many_arguments)] // one call's operands and its grid
    unsafe fn launch_message(
        &self,
        rank: i32,
        family: Family,
        dtype: DataType,
        message: &Message,
        tensors: &Tensors,
        stream: Stream,
        ctas: Option<u32>,
    ) -> Result<()> {
        let device = self.member(rank)?.device;
        let tuned = crate::launch::tuning::active();
        let cap = ctas.or_else(|| strategy::grid_cap(self.link_class(), family, self.nranks, tuned));
        let max_blocks = cap.map_or(self.max_blocks, |c| c.min(self.max_blocks));
        let p = plan::kernel(family, dtype, message, self.nranks, max_blocks, self.call_facts(device, tensors));
        let launch = self.launch_of(rank, family, dtype, &p)?;
        // SAFETY: the caller's contract.
        unsafe { self.run(rank, &launch, &p, tensors, stream) }
    }
}

/// The operands and message of a plain sum of `count` elements ([`Group::launch`],
/// [`Group::launch_with_ctas`]).
fn sum_call(dtype: DataType, input: DevicePtr, output: DevicePtr, count: usize) -> (Tensors, Message) {
    let tensors = Tensors::Sum { input, output, count: count as u64 };
    (tensors, Message { bytes: count as u64 * dtype.size() as u64, rows: None })
}
