//! The plugin's inputs and outputs as TensorRT describes them: how many, their types, shapes
//! and formats, at build time and at run time (the plain all-reduce: x -> sum; the fused op:
//! (x, residual, gamma[, bias]) -> (normed, residual_out)).

use crate::error::{Error, Result};
use crate::tensor::TensorDesc;
use crate::tensor::{self, DataType, LINEAR};

/// What a run-time call carries, once its descriptors are checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub count: usize,
    pub dtype: DataType,
    /// count * the element size: at most 2^63 - 1 (TensorRT's volumes are int64).
    pub bytes: u64,
    /// Fused op: `(tokens, hidden)` of x.
    pub rows: Option<(u64, u32)>,
}

/// The plugin's interface, from its configuration: the plain all-reduce, or the fused op with
/// or without a bias input.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Io {
    pub fused: bool,
    pub has_bias: bool,
}

fn same_dims(a: &TensorDesc, b: &TensorDesc) -> bool {
    a.nb_dims == b.nb_dims && a.dims[..a.nb_dims.clamp(0, 8) as usize] == b.dims[..b.nb_dims.clamp(0, 8) as usize]
}

impl Io {
    /// Checks the number of inputs and outputs TensorRT passes.
    pub(crate) fn expect(&self, nb_inputs: usize, nb_outputs: usize) -> Result<()> {
        let (want_in, want_out) = (self.nb_inputs() as usize, self.nb_outputs() as usize);
        if nb_inputs != want_in || nb_outputs != want_out {
            let what = if self.fused {
                if self.has_bias {
                    "(x, residual, gamma, bias) -> (normed, residual_out)"
                } else {
                    "(x, residual, gamma) -> (normed, residual_out)"
                }
            } else {
                "one input and one output"
            };
            return Err(Error::TensorCount { want_in, want_out, got_in: nb_inputs, got_out: nb_outputs, what });
        }
        Ok(())
    }

    /// 1 (x), or for the fused op 3 (x, residual, gamma) or 4 (+ bias).
    pub(crate) fn nb_inputs(&self) -> i32 {
        if self.fused {
            3 + self.has_bias as i32
        } else {
            1
        }
    }

    /// 1 (the sum), or for the fused op 2 (normed, residual_out).
    pub(crate) fn nb_outputs(&self) -> i32 {
        if self.fused {
            2
        } else {
            1
        }
    }

    /// Every output has the type of the inputs, which must all be FP32, FP16 or BF16 alike.
    pub(crate) fn output_types(&self, input_types: &[i32], output_types: &mut [i32]) -> Result<()> {
        self.expect(input_types.len(), output_types.len())?;
        DataType::from_trt(input_types[0]).ok_or(Error::UnsupportedType(input_types[0]))?;
        if let Some(index) = input_types.iter().position(|&t| t != input_types[0]) {
            return Err(Error::TypeMismatch { index, dtype: input_types[index], first: input_types[0] });
        }
        output_types.fill(input_types[0]);
        Ok(())
    }

    /// For each output, the index of the input whose shape it has (always x). For the fused op
    /// also checks what is known at build time: residual like x, gamma and bias of x's last dim.
    pub(crate) fn output_shape_sources(&self, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()> {
        self.expect(inputs.len(), sources.len())?;
        if self.fused {
            let x = &inputs[0];
            if !(1..=8).contains(&x.nb_dims) {
                return Err(Error::shape("x must have 1 to 8 dimensions, the last one the hidden size"));
            }
            let known_equal = |a: i64, b: i64| a < 0 || b < 0 || a == b;
            let r = &inputs[1];
            if r.nb_dims != x.nb_dims || (0..x.nb_dims as usize).any(|i| !known_equal(r.dims[i], x.dims[i])) {
                return Err(Error::shape("residual must have the shape of x"));
            }
            let hidden = x.dims[x.nb_dims as usize - 1];
            for (name, w) in [("gamma", &inputs[2])].into_iter().chain(inputs.get(3).map(|b| ("bias", b))) {
                if w.nb_dims != 1 || !known_equal(w.dims[0], hidden) {
                    return Err(Error::shape(format!("{name} must be 1-D of the hidden size (x's last dimension)")));
                }
            }
        }
        sources.fill(0);
        Ok(())
    }

    /// LINEAR; FP32/FP16/BF16; every tensor of the first one's type (Edge-LLM's rule, extended
    /// to the fused op's tensors).
    pub(crate) fn supports_format(&self, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool {
        let Ok(pos) = usize::try_from(pos) else { return false };
        if nb_inputs != self.nb_inputs()
            || in_out.len() != (self.nb_inputs() + self.nb_outputs()) as usize
            || pos >= in_out.len()
        {
            return false;
        }
        let d = &in_out[pos];
        d.format == LINEAR && DataType::from_trt(d.dtype).is_some() && (pos == 0 || d.dtype == in_out[0].dtype)
    }

    /// Validates run-time descriptors.
    pub(crate) fn check_run_time_io(&self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<Shape> {
        self.expect(inputs.len(), outputs.len())?;
        let dtype = tensor::data_type(&inputs[0])?;
        if let Some((index, d)) = inputs.iter().chain(outputs).enumerate().find(|(_, d)| d.dtype != inputs[0].dtype) {
            return Err(Error::TypeMismatch { index, dtype: d.dtype, first: inputs[0].dtype });
        }
        let count = tensor::element_count(&inputs[0])?;
        let bytes = tensor::byte_count(count, dtype)?;
        for (i, out) in outputs.iter().enumerate() {
            if !same_dims(out, &inputs[0]) {
                return Err(Error::shape(format!("output {i} must have the input's shape")));
            }
        }
        if !self.fused {
            return Ok(Shape { count, dtype, bytes, rows: None });
        }
        let x = &inputs[0];
        if x.nb_dims < 1 {
            return Err(Error::shape("x must have at least one dimension (the hidden size)"));
        }
        let hidden = x.dims[x.nb_dims as usize - 1];
        let hidden = u32::try_from(hidden)
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| Error::shape(format!("invalid hidden size {hidden}")))?;
        if !same_dims(&inputs[1], x) {
            return Err(Error::shape("residual must have the shape of x"));
        }
        for (name, w) in [("gamma", &inputs[2])].into_iter().chain(inputs.get(3).map(|b| ("bias", b))) {
            if tensor::element_count(w)? != hidden as usize {
                return Err(Error::shape(format!("{name} must hold {hidden} elements (the hidden size)")));
            }
        }
        Ok(Shape { count, dtype, bytes, rows: Some(((count / hidden as usize) as u64, hidden)) })
    }
}

#[cfg(test)]
mod tests {
    use crate::plugin::fields::PluginConfig;
    use crate::plugin::tests::{fused, plugin};
    use crate::plugin::PluginCore;
    use crate::tensor::desc;

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
        assert!(p.output_shape_sources(&[desc(&[4], 1)], &mut [0, 0]).is_err(), "two outputs");
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
    fn fused_interface_counts_types_and_formats() {
        for (bias, nb_in) in [(false, 3), (true, 4)] {
            let p = fused(2, bias);
            assert_eq!((p.nb_inputs(), p.nb_outputs()), (nb_in, 2));
            let mut out = [-1, -1];
            p.output_types(&vec![7; nb_in as usize], &mut out).unwrap();
            assert_eq!(out, [7, 7]);
            let mut types = vec![7; nb_in as usize];
            types[2] = 1;
            assert!(p.output_types(&types, &mut out).is_err(), "gamma of another type");
            assert!(p.output_types(&[7], &mut [0]).is_err(), "the plain interface is refused");
            let t = desc(&[4, 4096], 7);
            let mut io = vec![t; nb_in as usize + 2];
            for pos in 0..io.len() as i32 {
                assert!(p.supports_format(pos, &io, nb_in), "pos {pos}");
            }
            io[nb_in as usize + 1].dtype = 1;
            assert!(!p.supports_format(nb_in + 1, &io, nb_in), "residual_out of another type");
            assert!(!p.supports_format(0, &io[..2], 1));
        }
        let mut c = PluginConfig::with_tp_size(2).unwrap();
        c.has_bias = true;
        assert!(PluginCore::new(c.clone()).is_err(), "has_bias without fusion");
        c.config = crate::plugin::fields::config_bits::RESIDUAL_RMS_NORM;
        assert_eq!(PluginCore::new(c).unwrap().nb_inputs(), 4, "the seed's config bit also fuses");
    }
}
