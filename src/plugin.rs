//! The plugin's decisions, one method per TensorRT override that needs one: outputs, types,
//! shapes, formats, and what `enqueue` runs. The C++ class in `cpp/` only adapts TensorRT's
//! interfaces to these methods.

use crate::error::{Error, Result};
use crate::fields::{self, IncomingField, PluginConfig};
use crate::ffi::TensorDesc;
use crate::strategy::{self, Call, Fallback, Path};
use crate::tensor::{self, DataType, LINEAR};
use crate::{cuda, nccl, registry, workspace};
use std::sync::atomic::{AtomicU32, Ordering};

/// State of one plugin instance: its configuration (what its fields say).
#[derive(Clone, Debug)]
pub struct PluginCore {
    config: PluginConfig,
}

const NB_INPUTS: usize = 1;
const NB_OUTPUTS: usize = 1;

fn expect_io(nb_inputs: usize, nb_outputs: usize) -> Result<()> {
    if nb_inputs != NB_INPUTS || nb_outputs != NB_OUTPUTS {
        return Err(Error::invalid(format!(
            "AllReducePlugin takes {NB_INPUTS} input and {NB_OUTPUTS} output, got {nb_inputs} inputs and {nb_outputs} outputs"
        )));
    }
    Ok(())
}

impl PluginCore {
    pub fn new(config: PluginConfig) -> Result<Self> {
        if config.fuses_residual_rms_norm() {
            return Err(Error::Unsupported("the fused residual + RMSNorm all-reduce (fusion_op / config RESIDUAL_RMS_NORM)"));
        }
        Ok(PluginCore { config })
    }

    pub fn from_fields(fields: &[IncomingField]) -> Result<Self> {
        Self::new(fields::parse(fields)?)
    }

    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    pub fn nb_inputs(&self) -> i32 {
        NB_INPUTS as i32
    }

    pub fn nb_outputs(&self) -> i32 {
        NB_OUTPUTS as i32
    }

    pub fn output_types(&self, input_types: &[i32], output_types: &mut [i32]) -> Result<()> {
        expect_io(input_types.len(), output_types.len())?;
        DataType::from_trt(input_types[0])
            .ok_or_else(|| Error::invalid(format!("unsupported input type {} (supported: kFLOAT, kHALF, kBF16)", input_types[0])))?;
        output_types[0] = input_types[0];
        Ok(())
    }

    /// For each output, the index of the input whose shape it has.
    pub fn output_shape_sources(&self, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()> {
        expect_io(inputs.len(), sources.len())?;
        sources[0] = 0;
        Ok(())
    }

    /// Edge-LLM's rule: LINEAR, FP32/FP16/BF16, the output of the input's type.
    pub fn supports_format(&self, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool {
        let Ok(pos) = usize::try_from(pos) else { return false };
        if nb_inputs as usize != NB_INPUTS || in_out.len() != NB_INPUTS + NB_OUTPUTS || pos >= in_out.len() {
            return false;
        }
        let d = &in_out[pos];
        d.format == LINEAR && DataType::from_trt(d.dtype).is_some() && (pos < NB_INPUTS || d.dtype == in_out[0].dtype)
    }

    pub fn configure(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        expect_io(inputs.len(), outputs.len())
    }

    pub fn workspace_size(&self) -> usize {
        0
    }

    pub fn on_shape_change(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        self.check_run_time_io(inputs, outputs).map(|_| ())
    }

    /// Validates run-time descriptors; returns the element count and type.
    fn check_run_time_io(&self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<(usize, DataType)> {
        expect_io(inputs.len(), outputs.len())?;
        let dtype = tensor::data_type(&inputs[0])?;
        if outputs[0].dtype != inputs[0].dtype {
            return Err(Error::invalid(format!("output type {} differs from input type {}", outputs[0].dtype, inputs[0].dtype)));
        }
        let count = tensor::element_count(&inputs[0])?;
        let out_count = tensor::element_count(&outputs[0])?;
        if out_count != count {
            return Err(Error::invalid(format!("output has {out_count} elements, input has {count}")));
        }
        Ok((count, dtype))
    }

    /// Enqueues the all-reduce on `stream`. Never synchronizes or allocates.
    pub fn enqueue(
        &self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        input_ptrs: &[usize],
        output_ptrs: &[usize],
        stream: usize,
    ) -> Result<()> {
        let (count, dtype) = self.check_run_time_io(inputs, outputs)?;
        expect_io(input_ptrs.len(), output_ptrs.len())?;
        if count == 0 {
            return Ok(());
        }
        let (input, output) = (input_ptrs[0], output_ptrs[0]);
        if input == 0 || output == 0 {
            return Err(Error::invalid(format!("null tensor address (input {input:#x}, output {output:#x})")));
        }
        let requested = strategy::requested(&self.config);
        if self.config.tp_size <= 1 {
            // SAFETY: TensorRT hands enqueue device buffers of the described sizes on `stream`.
            return if input == output { Ok(()) } else { unsafe { cuda::copy_async(output, input, count * dtype.size(), stream) } };
        }
        let device = cuda::current_device()?;
        let registration =
            registry::get(device).ok_or(Error::NotRegistered { device, tp_size: self.config.tp_size })?;
        let group = workspace::group_for(device);
        let call = Call {
            tp_size: self.config.tp_size,
            dtype,
            bytes: (count * dtype.size()) as u64,
            aligned: (input | output) % 16 == 0,
        };
        let decision = strategy::choose(requested, &call, group.as_ref().map(|(g, _)| &**g as &dyn strategy::Capability));
        if let Some(reason) = decision.fallback {
            report_fallback(device, requested, reason, stream);
        }
        match (decision.path, group) {
            // SAFETY: every rank of the group takes this same path for this call (the choice is a
            // function of what they share); the buffers are TensorRT's, aligned as checked.
            (Path::Custom(family), Some((group, rank))) => unsafe {
                group.launch(rank, family, dtype, input, output, count, stream)
            },
            // SAFETY: the runtime registered a live communicator and ncclAllReduce for this
            // device; the buffers are TensorRT's, of `count` elements, on `stream`.
            _ => unsafe { nccl::all_reduce(registration, input, output, count, dtype, stream) },
        }
    }

    pub fn serialized_fields(&self) -> Vec<fields::OutgoingField> {
        fields::serialize(&self.config)
    }
}

/// Logs each kind of fallback once per process: a warning when a strategy was forced, an info
/// line under AUTO (plus one when a CUDA graph captures the NCCL path because no workspace exists).
fn report_fallback(device: i32, requested: strategy::Requested, reason: Fallback, stream: usize) {
    static LOGGED: AtomicU32 = AtomicU32::new(0);
    let forced = requested != strategy::Requested::Auto;
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
mod tests {
    use super::*;
    use crate::tensor::desc;

    fn plugin(tp: i32) -> PluginCore {
        PluginCore::new(PluginConfig::with_tp_size(tp).unwrap()).unwrap()
    }

    #[test]
    fn one_output_of_the_input_type() {
        let p = plugin(2);
        assert_eq!(p.nb_outputs(), 1);
        for t in [0, 1, 7] {
            let mut out = [-1];
            p.output_types(&[t], &mut out).unwrap();
            assert_eq!(out, [t]);
        }
        let mut out = [-1];
        assert!(p.output_types(&[3], &mut out).is_err(), "INT32 is not reduced");
        assert!(p.output_types(&[1, 1], &mut out).is_err(), "two inputs");
        assert!(p.output_types(&[1], &mut [0, 0]).is_err(), "two outputs");
        let mut src = [-1];
        p.output_shape_sources(&[desc(&[-1, 4096], 1)], &mut src).unwrap();
        assert_eq!(src, [0]);
    }

    #[test]
    fn formats_follow_edge_llm() {
        let p = plugin(2);
        let half = desc(&[1, 4096], 1);
        let float = desc(&[1, 4096], 0);
        assert!(p.supports_format(0, &[half, half], 1));
        assert!(p.supports_format(1, &[half, half], 1));
        assert!(!p.supports_format(1, &[half, float], 1), "output type must equal input type");
        assert!(!p.supports_format(2, &[half, half], 1));
        assert!(!p.supports_format(-1, &[half, half], 1));
        assert!(!p.supports_format(0, &[half, half, half], 2));
        let mut chw = half;
        chw.format = 1;
        assert!(!p.supports_format(0, &[chw, half], 1), "LINEAR only");
        assert!(!p.supports_format(0, &[desc(&[4], 2), half], 1), "INT8 is not supported");
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

    #[test]
    fn fusion_is_refused_until_it_exists() {
        let mut c = PluginConfig::with_tp_size(2).unwrap();
        c.fusion_op = crate::fields::FusionOp::ResidualRmsNorm;
        assert!(matches!(PluginCore::new(c), Err(Error::Unsupported(_))));
    }
}
