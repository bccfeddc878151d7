//! What a launch is, on the kernels' contract (`crate::contract`): the families, each described
//! once ([`family`]), which path a call takes ([`strategy`], AUTO's [`tables`] and the tuning
//! file, [`tuning`]), one rank's whole plan of a call ([`plan`]: path, kernels, grid, block, flags,
//! from one C rule shared with the kernel simulations), the embedded kernels ([`kernels`],
//! [`kernel_images`]), the one launcher ([`launcher`]) and the link probe's launches ([`probe`]).
//! Nothing here holds state: a group (`crate::group`) gathers the facts, asks for the plan and
//! executes it.

pub(crate) mod family;
pub(crate) mod kernel_images;
pub(crate) mod kernels;
pub(crate) mod launcher;
pub(crate) mod plan;
pub(crate) mod probe;
pub(crate) mod strategy;
pub(crate) mod tables;
pub(crate) mod tuning;

use crate::contract::{self, EarAllReduceParams, EarFusedParams};
use crate::cuda::DevicePtr;
use crate::link::LinkClass;
use crate::tensor::DataType;
use family::Family;

/// A message as the kernels see it: its bytes, and for the fused op its rows.
#[derive(Clone, Copy, Debug)]
pub struct Message {
    pub bytes: u64,
    /// `(tokens, hidden)` of a fused all-reduce + residual + RMSNorm; None for a plain sum.
    pub rows: Option<(u64, u32)>,
}

/// What the custom kernels can do for a call: implemented by `crate::group::Group`, and by
/// fakes in tests.
pub trait Fits {
    fn nranks(&self) -> i32;
    /// Whether `family` has a kernel for this group, `dtype` and the message's op, and takes it.
    fn serves(&self, family: Family, dtype: DataType, message: &Message) -> bool;
    /// What carries the bytes between the ranks (`crate::group::link`): AUTO keeps a table per
    /// class ([`strategy`]). NVLink unless said otherwise (the tables measured first).
    fn link_class(&self) -> LinkClass {
        LinkClass::NvLink
    }
    /// Whether families that load from their peers may run ([`strategy::pulls_enabled`], and
    /// peer reads supported and probed by the group's self-test). Yes unless said otherwise.
    fn pulls(&self) -> bool {
        true
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
    /// The fused kernels' parameter block around the all-reduce part `ar`.
    pub(crate) fn params(&self, ar: EarAllReduceParams) -> EarFusedParams {
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

    /// The parameter block of the residual + RMSNorm kernel alone, on `x_reduced` (already
    /// summed, or one rank's): the kernel reads only `ar.input` and `ar.count` of `ar`.
    pub(crate) fn norm_params(&self, x_reduced: DevicePtr) -> EarFusedParams {
        let ar = EarAllReduceParams {
            peer_ws: [std::ptr::null_mut(); contract::EAR_MAX_RANKS],
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
        self.params(ar)
    }
}

impl FusedCall {
    /// Residual + bias + RMSNorm alone, on `x_reduced` (already summed by NCCL or a plain
    /// all-reduce, or one rank's), with `kernels` of the current device.
    ///
    /// # Safety
    /// Every address must be a 16-byte aligned device buffer of the current device of the
    /// described size; `x_reduced` may equal `normed`.
    pub unsafe fn launch_norm(
        &self,
        kernels: &kernels::DeviceKernels,
        dtype: DataType,
        x_reduced: DevicePtr,
        stream: crate::cuda::Stream,
    ) -> crate::error::Result<()> {
        let plan = plan::norm(self.tokens, self.hidden, dtype, kernels.sm_count);
        // SAFETY: the caller's buffers, the kernel's own parameter block.
        unsafe { self.run_norm(kernels, dtype, &plan, x_reduced, stream) }
    }

    /// The residual + RMSNorm kernel alone on its `plan` (see [`FusedCall::launch_norm`]).
    ///
    /// # Safety
    /// As [`FusedCall::launch_norm`]; `plan` is the norm plan of this call.
    pub(crate) unsafe fn run_norm(
        &self,
        kernels: &kernels::DeviceKernels,
        dtype: DataType,
        plan: &contract::EarPlan,
        x_reduced: DevicePtr,
        stream: crate::cuda::Stream,
    ) -> crate::error::Result<()> {
        let f = kernels.norm(dtype).ok_or_else(|| crate::error::Error::NoKernel(family::norm_kernel_name(dtype)))?;
        let launch = launcher::Launch::planned(f, plan, kernels.pdl);
        // SAFETY: the caller's buffers, the kernel's own parameter block.
        unsafe { launch.run(&self.norm_params(x_reduced), stream) }
    }
}
