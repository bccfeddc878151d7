//! The fused sweep's pieces shared by both modes: one rank's buffers, the ops a fused row runs,
//! and one rank's enqueue of the custom ones.
//!
//! One fused call: x (per rank) summed over the ranks, + bias (optional) + residual →
//! residual_out, RMSNorm(residual_out) · gamma → normed; residual, gamma and bias are the same
//! on every rank (tensor parallelism). Every buffer is a fresh `cuMemAlloc` (256-byte aligned).

use crate::case::{Case, Shape};
use crate::gpu::{memset_async, DevBuf, Res};
use cudarc::driver::{CudaContext, CudaStream};
use edgellm_allreduce::{DataType, DeviceKernels, DevicePtr, Family, FusedCall, Group, Stream};
use edgellm_test_support::{self as data, OutputCheck, SharedInputs};
use std::sync::Arc;

/// The RMSNorm epsilon of every fused row: the fused plugin's default (its `eps` field).
pub fn eps() -> f32 {
    edgellm_allreduce::PluginConfig::with_tp_size(2).map_or(1e-6, |c| c.eps)
}

/// What one fused row runs on each rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedOp {
    /// `Group::launch_fused` of a family: one kernel.
    Fused(Family),
    /// `Group::launch` of a plain family (x → tmp), then `FusedCall::launch_norm` on tmp.
    ArThenNorm(Family),
    /// `ncclAllReduce` (x → normed), then `FusedCall::launch_norm` on normed, in place (real).
    NcclThenNorm,
    /// `PluginCore::enqueue` of a fused plugin (real).
    Plugin,
}

/// The `path` column of a fused row: the all-reduce that ran (family or NCCL).
pub fn path_of(op: FusedOp) -> &'static str {
    match op {
        FusedOp::Fused(f) | FusedOp::ArThenNorm(f) => Case::Custom(f).name(),
        FusedOp::NcclThenNorm => "nccl",
        FusedOp::Plugin => "plugin",
    }
}

/// One rank's tensors of the fused op, sized for the largest shape of the sweep.
pub struct FusedBufs {
    pub x: DevBuf,
    pub residual: DevBuf,
    pub gamma: DevBuf,
    pub bias: DevBuf,
    pub normed: DevBuf,
    pub residual_out: DevBuf,
    /// ar_then_norm: the plain all-reduce's output, which the norm kernel reads.
    pub tmp: DevBuf,
}

impl FusedBufs {
    /// `bytes`: the largest x; `row_bytes`: the largest gamma / bias.
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize, row_bytes: usize) -> Res<FusedBufs> {
        Ok(FusedBufs {
            x: DevBuf::new(ctx, bytes)?,
            residual: DevBuf::new(ctx, bytes)?,
            gamma: DevBuf::new(ctx, row_bytes)?,
            bias: DevBuf::new(ctx, row_bytes)?,
            normed: DevBuf::new(ctx, bytes)?,
            residual_out: DevBuf::new(ctx, bytes)?,
            tmp: DevBuf::new(ctx, bytes)?,
        })
    }

    /// This rank's x and the shared inputs (synchronous).
    pub fn upload(&self, x: &[u8], shared: &SharedInputs) -> Res<()> {
        self.x.upload(x)?;
        self.residual.upload(&shared.residual)?;
        self.gamma.upload(&shared.gamma)?;
        if !shared.bias.is_empty() {
            self.bias.upload(&shared.bias)?;
        }
        Ok(())
    }

    /// The call's tensors (the norm alone reads its x from the address given at launch).
    pub fn call(&self, shape: &Shape, eps: f32) -> FusedCall {
        FusedCall {
            x: DevicePtr(self.x.ptr),
            residual: DevicePtr(self.residual.ptr),
            bias: if shape.bias { DevicePtr(self.bias.ptr) } else { DevicePtr::NULL },
            gamma: DevicePtr(self.gamma.ptr),
            residual_out: DevicePtr(self.residual_out.ptr),
            normed: DevicePtr(self.normed.ptr),
            tokens: shape.tokens,
            hidden: shape.hidden,
            eps,
        }
    }

    /// Both outputs and the temporary filled with [`data::POISON`] (NaN), in stream order.
    pub fn poison(&self, bytes: usize, stream: &CudaStream) -> Res<()> {
        for b in [&self.normed, &self.residual_out, &self.tmp] {
            memset_async(b.ptr, data::POISON, bytes, stream)?;
        }
        Ok(())
    }

    /// Both outputs (synchronize the stream first).
    pub fn download(&self, bytes: usize) -> Res<(Vec<u8>, Vec<u8>)> {
        Ok((self.normed.download(bytes)?, self.residual_out.download(bytes)?))
    }
}

/// Checks of downloaded (normed, residual_out) pairs, one per rank, in rank order (one thread
/// per output: the references are up to a few million elements).
pub fn check_all(
    outputs: &[(Vec<u8>, Vec<u8>)],
    reference: &(Vec<f64>, Vec<f64>),
    dtype: DataType,
) -> Vec<OutputCheck> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            outputs.iter().map(|(n, r)| s.spawn(move || data::check_fused(n, r, reference, dtype))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("check thread")).collect()
    })
}

/// Enqueues rank `rank`'s part of a custom fused row ([`FusedOp::Fused`] or
/// [`FusedOp::ArThenNorm`]) on `stream`; `ctas`: the split op's plain all-reduce takes at most
/// this many CTAs (`Group::launch_with_ctas`; None: `Group::launch`'s cap). The fused kernels
/// take the family's cap on the group's links: the library has no fused launch at another grid.
///
/// # Safety
/// `bufs` on the rank's device, sized for `shape`; `stream` of that device; `kernels` of that
/// device; every rank of the group enqueues the same call in the same order.
#[allow(clippy::too_many_arguments)]
pub unsafe fn enqueue_custom(
    group: &Group,
    rank: usize,
    op: FusedOp,
    dtype: DataType,
    bufs: &FusedBufs,
    shape: &Shape,
    eps: f32,
    kernels: &DeviceKernels,
    stream: usize,
    ctas: Option<u32>,
) -> Res<()> {
    let call = bufs.call(shape, eps);
    let stream = Stream(stream);
    match op {
        FusedOp::Fused(f) => group
            .launch_fused(rank as i32, f, dtype, &call, stream)
            .map_err(|e| format!("launch_fused of rank {rank}: {e}")),
        FusedOp::ArThenNorm(f) => {
            let (tmp, rank_, count) = (DevicePtr(bufs.tmp.ptr), rank as i32, shape.count());
            match ctas {
                Some(c) => group.launch_with_ctas(rank_, f, dtype, call.x, tmp, count, stream, c),
                None => group.launch(rank_, f, dtype, call.x, tmp, count, stream),
            }
            .map_err(|e| format!("launch of rank {rank}: {e}"))?;
            call.launch_norm(kernels, dtype, tmp, stream).map_err(|e| format!("launch_norm of rank {rank}: {e}"))
        }
        FusedOp::NcclThenNorm | FusedOp::Plugin => Err(format!("{op:?} is not a custom op")),
    }
}
