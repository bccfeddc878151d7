//! The custom all-reduce kernels: embedded fatbins (`kernels/*.cu`, compiled by build.rs),
//! loaded once per device, and the host side of their contract (`kernels/allreduce_params.h`,
//! whose macros `kernels/layout.c` exports so that the layout is defined once).

use crate::cuda::{self, Function};
use crate::error::{Error, Result};
use crate::tensor::DataType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// `EAR_MAX_RANKS`.
pub const MAX_RANKS: usize = 16;
/// `EAR_BLOCK_THREADS`: the block of the one-shot and two-shot kernels (Lamport: at most this).
pub const BLOCK_THREADS: u32 = 512;
/// `EAR_MAX_BLOCKS`.
pub const MAX_BLOCKS: u32 = 128;
/// Rank counts the kernels are instantiated for.
pub const RANK_COUNTS: [i32; 5] = [2, 4, 6, 8, 16];

/// `EarAllReduceParams`, the kernels' one by-value argument.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AllReduceParams {
    pub peer_ws: [u64; MAX_RANKS],
    pub state: u64,
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub ws_max_bytes: u64,
    pub rank: i32,
    pub nranks: i32,
}

/// `EarFusedParams`: the fused all-reduce + residual (+ bias) + RMSNorm kernels' argument.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FusedParams {
    /// `ar.input` = x, `ar.count` = tokens * hidden; `ar.output` is ignored.
    pub ar: AllReduceParams,
    pub residual: u64,
    /// 0: no bias.
    pub bias: u64,
    pub gamma: u64,
    pub residual_out: u64,
    pub normed: u64,
    pub tokens: u64,
    pub hidden: u32,
    pub eps: f32,
}

extern "C" {
    fn ear_fused_block(hidden: u32, elem: u32) -> u32;
    fn ear_fused_grid(tokens: u64, max_blocks: u32) -> u32;
    fn ear_fused_lamport_grid(tokens: u64, hidden: u32, elem: u32, max_blocks: u32) -> u32;
    fn ear_fused_fits(family: i32, tokens: u64, hidden: u32, elem: u32, max_msg_bytes: u64, nranks: i32) -> i32;
    #[allow(dead_code)] // the layout test compares it with FusedParams
    fn ear_fused_params_size() -> u64;
    fn ear_workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64;
    fn ear_lamport_max_msg(max_msg_bytes: u64) -> u64;
    fn ear_grid(work_vecs: u64, max_blocks: u32) -> u32;
    fn ear_lamport_block(vecs: u64, max_blocks: u32) -> u32;
    fn ear_lamport_grid(vecs: u64, max_blocks: u32) -> u32;
    #[allow(dead_code)] // the layout test compares it with AllReduceParams
    fn ear_params_size() -> u64;
    fn ear_state_bytes() -> u32;
}

/// Bytes of one rank's workspace serving messages up to `max_msg_bytes` among `nranks`.
pub fn workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64 {
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_workspace_bytes(max_msg_bytes, nranks) }
}
/// Largest message the Lamport family takes in a workspace of `max_msg_bytes`.
pub fn lamport_max_bytes(max_msg_bytes: u64) -> u64 {
    // SAFETY: pure arithmetic.
    unsafe { ear_lamport_max_msg(max_msg_bytes) }
}
/// Bytes of one rank's local state block.
pub fn state_bytes() -> usize {
    // SAFETY: returns a constant.
    unsafe { ear_state_bytes() as usize }
}

/// What a kernel computes after the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The sum, and nothing else.
    AllReduce,
    /// `residual_out = sum + bias + residual`, `normed = RMSNorm(residual_out) * gamma`.
    ResidualRmsNorm,
}

/// Whether a fused message of `tokens` rows of `hidden` elements fits `family`'s workspace.
pub fn fused_fits(family: Family, tokens: u64, hidden: u32, elem: usize, max_msg_bytes: u64, nranks: i32) -> bool {
    let id = match family {
        Family::OneShot => 0,
        Family::TwoShot => 1,
        Family::Lamport => 2,
    };
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_fused_fits(id, tokens, hidden, elem as u32, max_msg_bytes, nranks) != 0 }
}

/// A kernel family: how the reduction moves data between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Every rank stages its input, one barrier, every rank reads all peers and reduces.
    OneShot,
    /// Polled (Lamport) reduce-scatter, then a polled all-gather (above 8 MiB paced by
    /// per-chunk flags, pipelined): 2(N-1)/N of the data over the links.
    TwoShot,
    /// Push one-shot whose payload is its own arrival flag: no barrier (small messages).
    Lamport,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::OneShot, Family::TwoShot, Family::Lamport];
    fn prefix(self) -> &'static str {
        match self {
            Family::OneShot => "oneshot",
            Family::TwoShot => "twoshot",
            Family::Lamport => "lamport",
        }
    }
    /// Largest message of this family in a workspace of `max_msg_bytes`.
    pub fn max_bytes(self, max_msg_bytes: u64) -> u64 {
        match self {
            Family::Lamport => lamport_max_bytes(max_msg_bytes),
            _ => max_msg_bytes,
        }
    }
}

fn type_suffix(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Float => "f32",
        DataType::Half => "f16",
        DataType::Bf16 => "bf16",
    }
}

fn kernel_name(family: Family, op: Op, dtype: DataType, nranks: i32) -> String {
    let norm = if op == Op::ResidualRmsNorm { "_norm" } else { "" };
    format!("ear_{}{norm}_{}_n{}", family.prefix(), type_suffix(dtype), nranks)
}

const TYPES: [DataType; 3] = [DataType::Float, DataType::Half, DataType::Bf16];

/// The kernels of one device (its primary context).
pub struct DeviceKernels {
    functions: HashMap<(Family, Op, DataType, i32), Function>,
    /// `ear_residual_rmsnorm_<t>`: residual + bias + RMSNorm alone (after NCCL, or one rank).
    norms: HashMap<DataType, Function>,
    /// Programmatic dependent launch: sm_90 and newer, when every kernel carries its
    /// `griddepcontrol.wait` (code from compute_90 or newer: PTX of compute_80 JIT-compiled for an
    /// sm_90 has none, and launched early it would read its inputs before they are written).
    pub pdl: bool,
    pub sm_count: i32,
    /// Why some kernel modules did not load (no image for this GPU, ...): then no group forms on
    /// this device (NCCL only), and the fused op runs only if the norm kernel loaded.
    pub unavailable: Option<String>,
}

impl DeviceKernels {
    fn load(device: i32) -> Result<Self> {
        let (major, sm_count) = cuda::device_properties(device)?;
        let keys: Vec<(Family, Op, DataType, i32)> = Family::ALL
            .iter()
            .flat_map(|&f| [Op::AllReduce, Op::ResidualRmsNorm].map(move |o| (f, o)))
            .flat_map(|(f, o)| TYPES.map(move |t| (f, o, t)))
            .flat_map(|(f, o, t)| RANK_COUNTS.map(move |n| (f, o, t, n)))
            .collect();
        let mut names: Vec<String> = keys.iter().map(|&(f, o, t, n)| kernel_name(f, o, t, n)).collect();
        names.extend(TYPES.map(|t| format!("ear_residual_rmsnorm_{}", type_suffix(t))));
        let (mut functions, mut norms) = (HashMap::new(), HashMap::new());
        let mut failed: Vec<(&str, i32)> = Vec::new();
        cuda::with_device(device, || {
            for (module, image) in MODULES {
                let found = match cuda::load_module(image, &names) {
                    Ok(found) => found,
                    Err(Error::Cuda { call: "cuModuleLoadData", code }) => {
                        failed.push((module, code));
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
            }
            Ok(())
        })?;
        let unavailable = (!failed.is_empty()).then(|| {
            let cc = cuda::compute_capability(device).unwrap_or(major as u32 * 10);
            let message = crate::kernel_images::unavailable_message(device, cc, IMAGES, &failed, norms.len() == TYPES.len());
            crate::log::warning(&message);
            message
        });
        let mut ptx_versions = functions.values().chain(norms.values()).map(|f| f.ptx_version());
        let sm90_code = ptx_versions.try_fold(true, |all, v| v.map(|v| all && v >= 90))?;
        let pdl = major >= 9 && sm90_code && std::env::var("EDGELLM_ALLREDUCE_PDL").map_or(true, |v| v != "0");
        Ok(DeviceKernels { functions, norms, pdl, sm_count, unavailable })
    }

    /// Err unless every custom kernel module loaded (a group needs them on every rank).
    pub fn require_all(&self) -> Result<()> {
        self.unavailable.as_ref().map_or(Ok(()), |why| Err(Error::invalid(why.clone())))
    }

    /// Err unless the residual + RMSNorm kernel that the fused op runs after NCCL (or alone,
    /// for one rank) loaded: checked at configure time, so enqueue never meets it missing.
    pub fn require_norm(&self) -> Result<()> {
        match &self.unavailable {
            Some(why) if self.norms.len() < TYPES.len() => Err(Error::invalid(format!("the fused residual + RMSNorm all-reduce cannot run: {why}"))),
            _ => Ok(()),
        }
    }

    pub fn function(&self, family: Family, op: Op, dtype: DataType, nranks: i32) -> Option<Function> {
        self.functions.get(&(family, op, dtype, nranks)).copied()
    }

    /// Enqueues one fused all-reduce + residual + RMSNorm of `family` (the fused launch rule:
    /// block from hidden and type, grid from tokens: identical on every rank).
    ///
    /// # Safety
    /// As [`DeviceKernels::launch`], for every tensor of `params`.
    pub unsafe fn launch_fused(
        &self,
        family: Family,
        dtype: DataType,
        params: &FusedParams,
        max_blocks: u32,
        stream: usize,
    ) -> Result<()> {
        let f = self.function(family, Op::ResidualRmsNorm, dtype, params.ar.nranks).ok_or_else(|| {
            Error::invalid(format!("no fused {family:?} kernel for {dtype:?} and {} ranks", params.ar.nranks))
        })?;
        let block = ear_fused_block(params.hidden, dtype.size() as u32);
        let cap = max_blocks.clamp(1, MAX_BLOCKS);
        let grid = match family {
            Family::Lamport => ear_fused_lamport_grid(params.tokens, params.hidden, dtype.size() as u32, cap),
            _ => ear_fused_grid(params.tokens, cap),
        };
        cuda::launch(f, grid, block, stream, params, self.pdl)
    }

    /// Enqueues residual + bias + RMSNorm alone (`params.ar.input` is the reduced x).
    ///
    /// # Safety
    /// As [`DeviceKernels::launch_fused`]; only `ar.input` and `ar.count` of `ar` are read.
    pub unsafe fn launch_norm(&self, dtype: DataType, params: &FusedParams, stream: usize) -> Result<()> {
        let f = *self.norms.get(&dtype).ok_or_else(|| {
            Error::invalid(format!("no residual + RMSNorm kernel for {dtype:?}: {}", self.unavailable.as_deref().unwrap_or("not found")))
        })?;
        let block = ear_fused_block(params.hidden, dtype.size() as u32);
        // Any grid works (no spinning): one CTA per row, up to 4 waves of the machine.
        let grid = ear_fused_grid(params.tokens, (self.sm_count.max(1) as u32) * 4);
        cuda::launch(f, grid, block, stream, params, self.pdl)
    }

    /// Enqueues one all-reduce of `family` on `stream` (the launch rule of allreduce_params.h:
    /// the grid depends only on the call, so it is identical on every rank).
    ///
    /// # Safety
    /// `params` must describe live workspaces of one group, and buffers of `count` elements on
    /// this device; `stream` must belong to this device's primary context.
    pub unsafe fn launch(
        &self,
        family: Family,
        dtype: DataType,
        params: &AllReduceParams,
        max_blocks: u32,
        stream: usize,
    ) -> Result<()> {
        let f = self
            .function(family, Op::AllReduce, dtype, params.nranks)
            .ok_or_else(|| Error::invalid(format!("no {family:?} kernel for {dtype:?} and {} ranks", params.nranks)))?;
        let vecs = (params.count * dtype.size() as u64).div_ceil(16);
        let cap = max_blocks.clamp(1, MAX_BLOCKS);
        let (grid, block) = match family {
            Family::Lamport => (ear_lamport_grid(vecs, cap), ear_lamport_block(vecs, cap)),
            Family::TwoShot => (ear_grid(vecs.div_ceil(params.nranks as u64), cap), BLOCK_THREADS),
            _ => (ear_grid(vecs, cap), BLOCK_THREADS),
        };
        cuda::launch(f, grid, block, stream, params, self.pdl)
    }
}

/// The kernels of `device`, loaded on first use (setup time, never in enqueue's first call:
/// groups load them when they are formed).
pub fn for_device(device: i32) -> Result<Arc<DeviceKernels>> {
    static LOADED: Mutex<Option<HashMap<i32, Arc<DeviceKernels>>>> = Mutex::new(None);
    let mut guard = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(k) = map.get(&device) {
        return Ok(k.clone());
    }
    let k = Arc::new(DeviceKernels::load(device)?);
    map.insert(device, k.clone());
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_c_header() {
        assert_eq!(std::mem::size_of::<AllReduceParams>() as u64, unsafe { ear_params_size() });
        assert_eq!(std::mem::size_of::<FusedParams>() as u64, unsafe { ear_fused_params_size() });
        assert_eq!(std::mem::offset_of!(FusedParams, eps), 228);
        assert_eq!(std::mem::offset_of!(AllReduceParams, rank), 168);
    }

    #[test]
    fn every_kernel_file_is_embedded() {
        let names: Vec<_> = MODULES.iter().map(|(n, _)| *n).collect();
        for family in ["oneshot", "twoshot", "lamport", "fused_norm"] {
            assert!(names.contains(&family), "{family} missing from {names:?}");
        }
        assert!(MODULES.iter().all(|(_, image)| image.len() > 1024), "fatbins are not empty");
    }

    #[test]
    fn workspace_and_grid_rules() {
        let small = workspace_bytes(1 << 20, 2);
        let large = workspace_bytes(16 << 20, 2);
        assert!(small >= 4 << 20 && large > small, "{small} {large}");
        assert!(workspace_bytes(16 << 20, 8) > large, "more ranks, more Lamport rows");
        assert_eq!(lamport_max_bytes(16 << 20), 2 << 20);
        assert_eq!(lamport_max_bytes(1 << 20), 1 << 20);
        assert_eq!(unsafe { ear_grid(1, 32) }, 1);
        assert_eq!(unsafe { ear_grid(512 * 10, 32) }, 10);
        assert_eq!(unsafe { ear_grid(1 << 30, 32) }, 32);
        assert_eq!(kernel_name(Family::Lamport, Op::AllReduce, DataType::Bf16, 8), "ear_lamport_bf16_n8");
        assert_eq!(kernel_name(Family::OneShot, Op::ResidualRmsNorm, DataType::Half, 2), "ear_oneshot_norm_f16_n2");
        assert_eq!(unsafe { ear_fused_block(4096, 2) }, 512);
        assert_eq!(unsafe { ear_fused_block(256, 2) }, 32);
        assert_eq!(unsafe { ear_fused_grid(1000, 32) }, 32);
        // Lamport: blocks of 128..512 threads spread mid-size messages over max_blocks CTAs.
        let lamport = |vecs: u64, cap: u32| unsafe { (ear_lamport_grid(vecs, cap), ear_lamport_block(vecs, cap)) };
        assert_eq!(lamport(1, 64), (1, 128));
        assert_eq!(lamport(512, 64), (4, 128), "8 KiB");
        assert_eq!(lamport(4096, 64), (32, 128), "64 KiB");
        assert_eq!(lamport(32768, 128), (128, 256), "512 KiB");
        assert_eq!(lamport(32768, 64), (64, 512));
        assert_eq!(lamport(1 << 20, 64), (64, 512), "grid-stride beyond 512 threads x max_blocks");
        assert_eq!(lamport(100, 64), (1, 128));
        // The fused Lamport grid covers every vector once (one per thread), at least one CTA per row.
        let fused = |t: u64, h: u32, cap: u32| unsafe { ear_fused_lamport_grid(t, h, 2, cap) };
        assert_eq!(fused(1, 4096, 64), 1, "512 vectors: one CTA");
        assert_eq!(fused(1, 16384, 128), 4, "one row, four CTAs push it");
        assert_eq!(fused(32, 8192, 128), 64, "32 rows of 1024 vectors, 512 threads");
        assert_eq!(fused(128, 8192, 128), 128, "256 CTAs would push one vector each: capped");
        assert_eq!(fused(128, 8192, 64), 64);
        assert_eq!(fused(100, 256, 64), 64, "rows of 32 vectors: one CTA per row, capped");
        assert_eq!(fused(3, 256, 64), 3);
        assert!(fused_fits(Family::OneShot, 128, 8192, 2, 16 << 20, 2));
        assert!(!fused_fits(Family::Lamport, 1024, 8192, 2, 16 << 20, 2), "over the 2 MiB Lamport cap");
        assert_eq!(state_bytes(), 32 * MAX_BLOCKS as usize, "one copy of the counters per CTA index");
    }
}
