//! The embedded CUDA kernels (`kernels/*.cu`, compiled by build.rs into fatbins), loaded once
//! per device (`crate::group::device` keeps them): every family's kernels by name
//! ([`crate::launch::family`] names them), the residual + RMSNorm kernel that follows NCCL, the
//! peer self-test (`crate::group::selftest`) and the link probe ([`crate::launch::probe`]).

use crate::cuda::{self, Function};
use crate::error::{Error, Result};
use crate::launch::family::{self, Family, Op, RANK_COUNTS, TYPES};
use crate::tensor::DataType;
use std::collections::HashMap;

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// The peer self-test's kernel (`kernels/selftest.cu`): a group runs it before its custom kernels
/// are trusted, so a device without it forms no group.
pub(crate) const SELFTEST_KERNEL: &str = "ear_selftest";
/// Its bandwidth check (the same file).
pub(crate) const SELFTEST_PUSH_KERNEL: &str = "ear_selftest_push";

/// The link probe's kernels (`crate::launch::probe`), in the order [`DeviceKernels`] keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeKernel {
    Copy,
    Latency,
}

impl ProbeKernel {
    pub(crate) const ALL: [ProbeKernel; 2] = [ProbeKernel::Copy, ProbeKernel::Latency];

    pub(crate) fn name(self) -> &'static str {
        match self {
            ProbeKernel::Copy => "ear_probe_copy",
            ProbeKernel::Latency => "ear_probe_latency",
        }
    }
}

/// The kernels of one device (its primary context).
pub struct DeviceKernels {
    functions: HashMap<(Family, Op, DataType, i32), Function>,
    /// `ear_residual_rmsnorm_<t>`: residual + bias + RMSNorm alone (after NCCL, or one rank).
    norms: HashMap<DataType, Function>,
    /// `ear_selftest` and `ear_selftest_push` (`crate::group::selftest`).
    selftest: Option<(Function, Function)>,
    /// The link probe's kernels, in [`ProbeKernel::ALL`]'s order (no group needs them).
    probe: [Option<Function>; 2],
    /// Programmatic dependent launch: sm_90 and newer, unless EDGELLM_ALLREDUCE_PDL=0, when every
    /// kernel carries its `griddepcontrol.wait` (code from compute_90 or newer: PTX of compute_80
    /// JIT-compiled for an sm_90 has none, and launched early it would read its inputs before
    /// they are written).
    pub pdl: bool,
    /// Every kernel's code is from compute_90 or newer: it has the 16-byte atomics through which
    /// a group of one process tells its ranks where their inputs are (`EAR_CALL_POINTERS`).
    pub sm90_code: bool,
    pub sm_count: i32,
    /// Why some kernel modules did not load (no image for this GPU, ...): then no group forms on
    /// this device (NCCL only), and the fused op runs only if the norm kernel loaded.
    pub unavailable: Option<String>,
}

impl DeviceKernels {
    /// Loads every kernel module into `context`, the primary context of `device`.
    pub(crate) fn load(device: i32, context: cuda::Context) -> Result<Self> {
        let (major, sm_count) = cuda::device_properties(device)?;
        let keys: Vec<(Family, Op, DataType, i32)> = Family::ALL
            .iter()
            .flat_map(|&f| [Op::AllReduce, Op::ResidualRmsNorm].map(move |o| (f, o)))
            .flat_map(|(f, o)| TYPES.map(move |t| (f, o, t)))
            .flat_map(|(f, o, t)| RANK_COUNTS.map(move |n| (f, o, t, n)))
            .collect();
        let mut names: Vec<String> = keys.iter().map(|&(f, o, t, n)| family::kernel_name(f, o, t, n)).collect();
        names.extend(TYPES.map(family::norm_kernel_name));
        names.extend([SELFTEST_KERNEL, SELFTEST_PUSH_KERNEL].map(str::to_owned));
        names.extend(ProbeKernel::ALL.map(|k| k.name().to_owned()));
        let (mut functions, mut norms, mut selftest, mut probes) = (HashMap::new(), HashMap::new(), None, [None; 2]);
        let mut failed: Vec<(&str, i32)> = Vec::new();
        cuda::with_context(context, || {
            for (module, image, defined) in MODULES {
                let found = match cuda::load_module(image, &names, defined) {
                    Ok(found) => found,
                    Err(Error::Cuda { call: "cuModuleLoadData", code, .. }) => {
                        failed.push((module, code as i32));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                for (key, f) in keys.iter().zip(&found) {
                    if let Some(f) = f {
                        functions.insert(*key, *f);
                    }
                }
                for (t, f) in TYPES.iter().zip(&found[keys.len()..]) {
                    if let Some(f) = f {
                        norms.insert(*t, *f);
                    }
                }
                let at = keys.len() + TYPES.len();
                selftest = selftest.or(found[at].zip(found[at + 1]));
                for (slot, f) in probes.iter_mut().zip(&found[at + 2..]) {
                    *slot = slot.or(*f);
                }
            }
            Ok(())
        })?;
        let unavailable = (!failed.is_empty()).then(|| {
            let cc = cuda::compute_capability(device).unwrap_or(major as u32 * 10);
            let message = crate::launch::kernel_images::unavailable_message(
                device,
                cc,
                IMAGES,
                &failed,
                norms.len() == TYPES.len(),
            );
            crate::log::warning(&message);
            message
        });
        // Asking for an attribute loads the self-test's code now: under lazy loading its first
        // launch would, delaying that rank's kernel behind its peers' by the load.
        if let Some((test, push)) = selftest {
            test.ptx_version()?;
            push.ptx_version()?;
        }
        let mut ptx_versions = functions.values().chain(norms.values()).map(|f| f.ptx_version());
        let sm90_code = ptx_versions.try_fold(true, |all, v| v.map(|v| all && v >= 90))?;
        let pdl = major >= 9 && sm90_code && crate::config::get().pdl;
        Ok(DeviceKernels { functions, norms, selftest, probe: probes, pdl, sm90_code, sm_count, unavailable })
    }

    /// Err unless every custom kernel module loaded, the peer self-test's among them (a group
    /// needs them on every rank, and runs the self-test before it is trusted).
    pub fn require_all(&self) -> Result<()> {
        if let Some(why) = &self.unavailable {
            return Err(Error::KernelsUnavailable(why.clone()));
        }
        self.selftest.map(|_| ()).ok_or_else(|| Error::NoKernel(SELFTEST_KERNEL.to_owned()))
    }

    /// The peer self-test's kernels (`ear_selftest`, `ear_selftest_push`), if they loaded.
    pub(crate) fn selftest(&self) -> Option<(Function, Function)> {
        self.selftest
    }

    /// One of the link probe's kernels, if it loaded.
    pub(crate) fn probe(&self, kernel: ProbeKernel) -> Option<Function> {
        self.probe[kernel as usize]
    }

    /// Err unless the residual + RMSNorm kernel that the fused op runs after NCCL (or alone,
    /// for one rank) loaded: checked at configure time, so enqueue never meets it missing.
    pub fn require_norm(&self) -> Result<()> {
        match &self.unavailable {
            Some(why) if self.norms.len() < TYPES.len() => Err(Error::NormUnavailable(why.clone())),
            _ => Ok(()),
        }
    }

    pub fn function(&self, family: Family, op: Op, dtype: DataType, nranks: i32) -> Option<Function> {
        self.functions.get(&(family, op, dtype, nranks)).copied()
    }

    pub fn norm(&self, dtype: DataType) -> Option<Function> {
        self.norms.get(&dtype).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_embedded() {
        let names: Vec<_> = MODULES.iter().map(|(n, _, _)| *n).collect();
        let sources = Family::ALL.iter().flat_map(|f| f.describe().sources.iter().copied());
        for file in sources.chain(["rmsnorm", "selftest", "probe"]) {
            assert!(names.contains(&file), "{file} missing from {names:?}");
        }
        assert!(MODULES.iter().all(|(_, image, _)| image.len() > 1024), "fatbins are not empty");
    }

    /// The names Rust asks the driver for are the names the kernel files define (the
    /// fatbins hold their ELF symbol tables uncompressed), so neither side can drift alone.
    #[test]
    fn every_kernel_the_loader_asks_for_is_in_a_fatbin() {
        let holds = |name: &str| {
            let needle = format!("{name}\0");
            MODULES.iter().any(|(_, image, _)| image.windows(needle.len()).any(|w| w == needle.as_bytes()))
        };
        let mut names: Vec<String> = TYPES.map(family::norm_kernel_name).to_vec();
        names.extend([SELFTEST_KERNEL, SELFTEST_PUSH_KERNEL].map(str::to_owned));
        names.extend(ProbeKernel::ALL.map(|k| k.name().to_owned()));
        for f in Family::ALL {
            for op in [Op::AllReduce, Op::ResidualRmsNorm] {
                names.extend(TYPES.iter().flat_map(|&t| RANK_COUNTS.map(|n| family::kernel_name(f, op, t, n))));
            }
        }
        assert_eq!(names.len(), TYPES.len() + 2 + 2 + 2 * Family::ALL.len() * TYPES.len() * RANK_COUNTS.len());
        let missing: Vec<_> = names.iter().filter(|n| !holds(n)).collect();
        assert!(missing.is_empty(), "kernels missing from the fatbins: {missing:?}");
        assert!(!holds("ear_oneshot_f16_n2"), "the names before they said their sync method are gone");
        // The loader asks each module only for what it defines: every name in exactly one list.
        for name in &names {
            let lists = MODULES.iter().filter(|(_, _, defined)| defined.contains(&name.as_str())).count();
            assert_eq!(lists, 1, "{name} is listed by {lists} modules");
        }
        // The modules define nothing else but the two two-shots at the rank counts the other one
        // serves (twoshot_polled at 4+ ranks, twoshot_barrier at 2): the simulations and
        // tools/gpu/twoshot_stages.cu compare them at every rank count; the loader never asks.
        let spare: Vec<&str> =
            MODULES.iter().flat_map(|m| m.2.iter().copied()).filter(|d| !names.iter().any(|n| n == d)).collect();
        assert_eq!(spare.len(), 3 * 4 + 3, "{spare:?}");
        for name in spare {
            let polled_wide = name.starts_with("ear_twoshot_polled_") && !name.ends_with("_n2");
            assert!(
                polled_wide || (name.starts_with("ear_twoshot_barrier_") && name.ends_with("_n2")),
                "{name} is defined but never loaded"
            );
        }
    }
}
