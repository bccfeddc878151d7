//! The plugin's decisions, one method per TensorRT override that needs one, and what `enqueue`
//! runs (its tensors' checks are `crate::plugin::io`'s). The C++ class in `cpp/` only adapts TensorRT's
//! interfaces to these methods.

pub(crate) mod fields;
pub(crate) mod io;

use crate::cuda::{self, DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::group::device;
use crate::group::run::{self, Tensors};
use crate::launch::family::Family;
use crate::launch::strategy::{Call, Fallback, Requested};
use crate::launch::{FusedCall, Message};
use crate::tensor::TensorDesc;
use fields::{IncomingField, PluginConfig, Strategy};
use io::{Io, Shape};
use std::sync::atomic::{AtomicU32, Ordering};

/// The strategy a plugin runs: `EDGELLM_ALLREDUCE_STRATEGY` if set, else its `strategy` field.
pub fn requested(config: &PluginConfig) -> Requested {
    Requested::configured().unwrap_or(match config.strategy {
        Strategy::Nccl => Requested::Nccl,
        Strategy::OneShot => Requested::Family(Family::OneShot),
        Strategy::TwoShot => Requested::Family(Family::TwoShot),
        Strategy::Auto => Requested::Auto,
    })
}

/// State of one plugin instance: its configuration (what its fields say).
#[derive(Clone, Debug)]
pub struct PluginCore {
    config: PluginConfig,
}

impl PluginCore {
    pub fn new(config: PluginConfig) -> Result<Self> {
        if config.has_bias && !config.fuses_residual_rms_norm() {
            return Err(Error::field(
                "has_bias",
                "is set but no fusion is (fusion_op RESIDUAL_RMS_NORM or config bit 2)",
            ));
        }
        Ok(PluginCore { config })
    }

    pub fn from_fields(fields: &[IncomingField]) -> Result<Self> {
        Self::new(fields::parse(fields)?)
    }

    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    fn fused(&self) -> bool {
        self.config.fuses_residual_rms_norm()
    }

    /// Its inputs and outputs (`crate::plugin::io`).
    fn io(&self) -> Io {
        Io { fused: self.fused(), has_bias: self.config.has_bias }
    }

    /// 1 (x), or for the fused op 3 (x, residual, gamma) or 4 (+ bias).
    pub fn nb_inputs(&self) -> i32 {
        self.io().nb_inputs()
    }

    /// 1 (the sum), or for the fused op 2 (normed, residual_out).
    pub fn nb_outputs(&self) -> i32 {
        self.io().nb_outputs()
    }

    /// Every output has the type of the inputs, which must all be FP32, FP16 or BF16 alike.
    pub fn output_types(&self, input_types: &[i32], output_types: &mut [i32]) -> Result<()> {
        self.io().output_types(input_types, output_types)
    }

    /// For each output, the index of the input whose shape it has (always x); for the fused op
    /// also checks what is known at build time.
    pub fn output_shape_sources(&self, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()> {
        self.io().output_shape_sources(inputs, sources)
    }

    /// LINEAR; FP32/FP16/BF16; every tensor of the first one's type.
    pub fn supports_format(&self, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool {
        self.io().supports_format(pos, in_out, nb_inputs)
    }

    pub fn configure(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        self.io().expect(inputs.len(), outputs.len())?;
        self.preload_kernels()
    }

    /// The fused op may run the residual + RMSNorm kernel without a group (one rank, or after
    /// NCCL): load the current device's kernels now, at setup, so that the first enqueue (maybe
    /// under CUDA-graph capture) finds them loaded, and fail here if that kernel cannot run on
    /// this GPU. Otherwise best effort: without a GPU there is nothing to load, and enqueue
    /// reports that.
    fn preload_kernels(&self) -> Result<()> {
        if self.fused() {
            if let Ok(kernels) = cuda::current_device().and_then(device::kernels) {
                kernels.require_norm()?;
            }
        }
        Ok(())
    }

    pub fn workspace_size(&self) -> usize {
        0
    }

    pub fn on_shape_change(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        self.io().check_run_time_io(inputs, outputs)?;
        self.preload_kernels()
    }

    /// Enqueues the all-reduce (or the fused op) on `stream`. Never synchronizes or allocates.
    pub fn enqueue(
        &self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        input_ptrs: &[usize],
        output_ptrs: &[usize],
        stream: usize,
    ) -> Result<()> {
        let shape = self.io().check_run_time_io(inputs, outputs)?;
        self.io().expect(input_ptrs.len(), output_ptrs.len())?;
        if shape.count == 0 {
            return Ok(());
        }
        if input_ptrs.iter().chain(output_ptrs).any(|&p| p == 0) {
            return Err(Error::NullTensor { inputs: input_ptrs.to_vec(), outputs: output_ptrs.to_vec() });
        }
        let (ptr, stream) = (|p: usize| DevicePtr(p as u64), Stream(stream));
        let tensors = match shape.rows {
            None => Tensors::Sum { input: ptr(input_ptrs[0]), output: ptr(output_ptrs[0]), count: shape.count as u64 },
            Some((tokens, hidden)) => {
                let names = ["x (input 0)", "residual (input 1)", "gamma (input 2)", "bias (input 3)"];
                let outputs = ["normed (output 0)", "residual_out (output 1)"];
                let unaligned: Vec<String> = (names.iter().zip(input_ptrs))
                    .chain(outputs.iter().zip(output_ptrs))
                    .filter(|(_, &p)| p % 16 != 0)
                    .map(|(name, p)| format!("{name} at {p:#x}"))
                    .collect();
                if !unaligned.is_empty() {
                    return Err(Error::Unaligned(unaligned.join(", ")));
                }
                Tensors::Fused(FusedCall {
                    x: ptr(input_ptrs[0]),
                    residual: ptr(input_ptrs[1]),
                    gamma: ptr(input_ptrs[2]),
                    bias: ptr(input_ptrs.get(3).copied().unwrap_or(0)),
                    normed: ptr(output_ptrs[0]),
                    residual_out: ptr(output_ptrs[1]),
                    tokens,
                    hidden,
                    eps: self.config.eps,
                })
            }
        };
        if self.config.tp_size <= 1 {
            return self.enqueue_alone(shape, &tensors, stream);
        }
        let aligned = shape.rows.is_some() || (input_ptrs[0] | output_ptrs[0]).is_multiple_of(16);
        let call = Call {
            tp_size: self.config.tp_size,
            dtype: shape.dtype,
            message: Message { bytes: shape.bytes, rows: shape.rows },
            aligned,
        };
        let device = cuda::current_device()?;
        let requested = requested(&self.config);
        let plan = run::plan_call(device, requested, &call, &tensors, stream)?;
        if let Some(reason) = plan.decision.fallback {
            report_fallback(device, requested, reason, stream);
        }
        // SAFETY: TensorRT's buffers of the checked shapes, aligned as checked, on `stream`; every
        // rank of the group plans this same call the same way (the plan is a function of what
        // they share).
        unsafe { plan.run(&tensors, stream) }
    }

    /// One rank (`tp_size <= 1`, Edge-LLM's passthrough): the sum is the input, copied unless in
    /// place; the fused op runs the residual + RMSNorm kernel alone.
    fn enqueue_alone(&self, shape: Shape, tensors: &Tensors, stream: Stream) -> Result<()> {
        match *tensors {
            Tensors::Sum { input, output, .. } if input == output => Ok(()),
            // SAFETY: TensorRT hands enqueue device buffers of the described sizes on `stream`.
            Tensors::Sum { input, output, .. } => unsafe {
                cuda::copy_async(output, input, shape.bytes as usize, stream)
            },
            Tensors::Fused(call) => {
                let kernels = device::kernels(cuda::current_device()?)?;
                // SAFETY: TensorRT's buffers of the checked shapes, aligned as checked, on `stream`.
                unsafe { call.launch_norm(&kernels, shape.dtype, call.x, stream) }
            }
        }
    }

    pub fn serialized_fields(&self) -> Vec<fields::OutgoingField> {
        fields::serialize(&self.config)
    }
}

/// Logs each kind of fallback once per process: a warning when a strategy was forced or when a
/// second stream met the group, an info line under AUTO (plus one when a CUDA graph captures the
/// NCCL path because no workspace exists).
fn report_fallback(device: i32, requested: Requested, reason: Fallback, stream: Stream) {
    static LOGGED: AtomicU32 = AtomicU32::new(0);
    let forced = requested != Requested::Auto || reason == Fallback::OtherStream;
    let bit = 1u32 << (reason as u32 * 2 + forced as u32);
    if LOGGED.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
        return;
    }
    let capturing = reason == Fallback::NoWorkspace && cuda::is_capturing(stream).unwrap_or(false);
    let message = format!(
        "device {device}: {requested:?} all-reduce falls back to NCCL: {}{}",
        reason.describe(),
        if capturing { " (this CUDA graph captures the NCCL path)" } else { "" }
    );
    if forced {
        crate::log::warning(&message)
    } else {
        crate::log::info(&message)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tensor::desc;

    pub(crate) fn plugin(tp: i32) -> PluginCore {
        PluginCore::new(PluginConfig::with_tp_size(tp).unwrap()).unwrap()
    }

    #[test]
    fn run_time_shapes_are_checked() {
        let mut p = plugin(2);
        let a = desc(&[2, 8], 7);
        p.on_shape_change(&[a], &[a]).unwrap();
        assert!(p.on_shape_change(&[a], &[desc(&[2, 9], 7)]).is_err());
        assert!(p.on_shape_change(&[a], &[desc(&[2, 8], 1)]).is_err());
        assert!(p.on_shape_change(&[a, a], &[a]).is_err());
        assert_eq!(p.workspace_size(), 0);
    }

    #[test]
    fn enqueue_rejects_bad_calls_before_touching_the_gpu() {
        let p = plugin(2);
        let a = desc(&[4], 1);
        assert!(p.enqueue(&[a], &[a], &[0], &[0x10], 0).unwrap_err().to_string().contains("null"));
        assert!(p.enqueue(&[a], &[a], &[0x10], &[0], 0).is_err());
        assert!(p.enqueue(&[a], &[desc(&[4], 0)], &[0x10], &[0x20], 0).is_err());
        // An empty tensor needs no work and no GPU.
        let empty = desc(&[0, 4096], 1);
        p.enqueue(&[empty], &[empty], &[0], &[0], 0).unwrap();
        // In place with one rank is a no-op.
        plugin(1).enqueue(&[a], &[a], &[0x10], &[0x10], 0).unwrap();
    }

    pub(crate) fn fused(tp: i32, bias: bool) -> PluginCore {
        let mut c = PluginConfig::with_tp_size(tp).unwrap();
        c.fusion_op = crate::plugin::fields::FusionOp::ResidualRmsNorm;
        c.has_bias = bias;
        PluginCore::new(c).unwrap()
    }

    #[test]
    fn fused_shapes_are_checked() {
        let p = fused(2, true);
        let (x, g) = (desc(&[-1, 8, 4096], 1), desc(&[4096], 1));
        let mut src = [-1, -1];
        p.output_shape_sources(&[x, x, g, g], &mut src).unwrap();
        assert_eq!(src, [0, 0]);
        assert!(p.output_shape_sources(&[x, desc(&[-1, 4096], 1), g, g], &mut src).is_err(), "residual rank");
        assert!(p.output_shape_sources(&[x, x, desc(&[4095], 1), g], &mut src).is_err(), "gamma size");
        assert!(p.output_shape_sources(&[x, x, g, desc(&[2, 4096], 1)], &mut src).is_err(), "bias rank");
        let mut q = fused(2, false);
        let (x, g) = (desc(&[3, 5120], 7), desc(&[5120], 7));
        q.on_shape_change(&[x, x, g], &[x, x]).unwrap();
        assert!(q.on_shape_change(&[x, desc(&[3, 5121], 7), g], &[x, x]).is_err());
        assert!(q.on_shape_change(&[x, x, desc(&[5121], 7)], &[x, x]).is_err());
        assert!(q.on_shape_change(&[x, x, g], &[x, desc(&[3, 5120], 1)]).is_err());
        assert!(q.on_shape_change(&[desc(&[3, 0], 7), desc(&[3, 0], 7), desc(&[0], 7)], &[x, x]).is_err());
        let a = 0x1000;
        assert!(q
            .enqueue(&[x, x, g], &[x, x], &[a, a + 8, a], &[a, a], 0)
            .unwrap_err()
            .to_string()
            .contains("aligned"));
    }
}
