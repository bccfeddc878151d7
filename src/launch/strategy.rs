//! Which path runs an all-reduce: a copy (one rank), NCCL, or a custom kernel family.
//!
//! Every rank of a communicator must take the same path for the same call, so the choice is a
//! pure function of what all ranks share: the plugin's fields (or the environment override),
//! the message size, the group's rank count, workspace and devices (separate GPUs, or all on
//! one), and the tensor alignment (TensorRT lays out the same engine identically on every rank).
//!
//! AUTO picks by the group's links ([`Fits::link_class`]: one set of [`AutoTables`] per
//! [`LinkClass`]), rank count and message size: [`NVLINK_TABLES`] (measured on 2 x H200),
//! [`PCIE_TABLES`] (from a model: families that read from peers, NCCL for large messages),
//! [`SAME_DEVICE_TABLES`] (simulated ranks, where memory instead of the links carries the
//! bytes), NCCL when there is no peer access; a tuning file measured on this machine
//! (`crate::launch::tuning`) takes the place of the built-in tables of its link class. A family that
//! cannot serve a call (message over its workspace, unaligned tensors, no group) falls back to
//! the next larger family (on PCIe never to one that writes into its peers), then to NCCL. A
//! forced strategy that cannot run falls back to NCCL.

pub use super::tables::*;
use crate::launch::family::{Family, Op};
use crate::launch::tuning::Tuning;
use crate::launch::{Fits, Message};
use crate::link::LinkClass;
use crate::tensor::DataType;
/// A strategy as asked for: the plugin's `strategy` field, or `EDGELLM_ALLREDUCE_STRATEGY`
/// (which overrides every plugin's field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Nccl,
    Auto,
    /// One family (by the environment: any family; the plugin's field names the seed's two).
    Family(Family),
}

impl Requested {
    /// NCCL, AUTO or a family's name, in any case.
    pub fn from_name(name: &str) -> Option<Requested> {
        let name = name.trim();
        if name.eq_ignore_ascii_case("NCCL") {
            Some(Requested::Nccl)
        } else if name.eq_ignore_ascii_case("AUTO") {
            Some(Requested::Auto)
        } else {
            Family::from_name(name).map(Requested::Family)
        }
    }

    /// Its name, upper case ("ONESHOT").
    pub fn name(self) -> String {
        match self {
            Requested::Nccl => "NCCL".to_owned(),
            Requested::Auto => "AUTO".to_owned(),
            Requested::Family(f) => f.name().to_uppercase(),
        }
    }

    /// `EDGELLM_ALLREDUCE_STRATEGY` (`crate::config`, read once), parsed once: every enqueue
    /// asks. One warning when it names no strategy, which is then ignored.
    pub(crate) fn configured() -> Option<Requested> {
        static CONFIGURED: std::sync::OnceLock<Option<Requested>> = std::sync::OnceLock::new();
        *CONFIGURED.get_or_init(|| {
            let text = crate::config::get().strategy.as_deref()?;
            let requested = Requested::from_name(text);
            if requested.is_none() {
                let names: Vec<String> = Family::ALL.iter().map(|f| f.name().to_uppercase()).collect();
                crate::log::warning(&format!(
                    "EDGELLM_ALLREDUCE_STRATEGY={text} is not one of NCCL, AUTO, {}: ignored",
                    names.join(", ")
                ))
            }
            requested
        })
    }

    /// Its code in the exchange record (0 there: unset): ranks that differ use NCCL.
    pub(crate) fn code(self) -> u32 {
        match self {
            Requested::Nccl => 1,
            Requested::Auto => 2,
            Requested::Family(f) => 16 + f.id() as u32,
        }
    }

    /// The strategy of exchange code `code`.
    pub(crate) fn from_code(code: u32) -> Option<Requested> {
        match code {
            1 => Some(Requested::Nccl),
            2 => Some(Requested::Auto),
            _ => code.checked_sub(16).and_then(|id| Family::from_id(id as i32)).map(Requested::Family),
        }
    }
}

fn row_of<T: Copy>(table: RankTable<T>, nranks: i32, bytes: u64) -> Option<T> {
    let row = table.iter().find(|(n, _)| nranks <= *n).unwrap_or(&table[table.len() - 1]).1;
    row.iter().find(|(b, _)| bytes <= *b).map(|(_, c)| *c)
}

/// AUTO's choice for a call, as a fused choice (a plain all-reduce is never split): from
/// `tuned` when it was measured on links of `class` and covers the call, else from the built-in
/// tables of `class`.
fn auto_choice(
    nranks: i32,
    dtype: DataType,
    message: &Message,
    class: LinkClass,
    tuned: Option<&Tuning>,
) -> FusedChoice {
    if let Some(choice) = tuned.and_then(|t| t.choice(class, nranks, dtype, message)) {
        return choice;
    }
    let Some(tables) = builtin_tables(class) else { return FusedChoice::Nccl };
    if message.rows.is_some() {
        let wide = message.rows.is_some_and(|(_, hidden)| hidden > NARROW_ROW);
        let table = if wide { tables.fused_wide } else { tables.fused };
        row_of(table, nranks, message.bytes).unwrap_or(FusedChoice::Nccl)
    } else {
        match row_of(tables.plain, nranks, message.bytes).flatten() {
            Some(f) => FusedChoice::Fused(f),
            None => FusedChoice::Nccl,
        }
    }
}

/// Whether a family that loads from its peers may run on a group of `nranks` on links of
/// `class` (decided alike on every rank, at formation: the group's self-test probes peer loads
/// only then). Over PCIe only where the user chose one: a tuning file measured on these links
/// picks one, or `EDGELLM_ALLREDUCE_STRATEGY` names one. The built-in PCIe tables never pull:
/// on some platforms peer reads never complete (haohervchb/sglang-V100#2; client CPUs support
/// peer writes only, NVIDIA/open-gpu-kernel-modules#1253), and where they do, pushing measured
/// faster (squibloads/vllm-pcie-allreduce; `crate::launch::tables`).
pub(crate) fn pulls_enabled(class: LinkClass, nranks: i32, tuned: Option<&Tuning>) -> bool {
    let pulls = |f: Family| [Op::AllReduce, Op::ResidualRmsNorm].into_iter().any(|op| !f.writes_into_peers(op, nranks));
    class != LinkClass::Pcie
        || matches!(Requested::configured(), Some(Requested::Family(f)) if pulls(f))
        || tuned.is_some_and(|t| t.chooses_pull(class, nranks))
}

/// The most CTAs `family`'s kernels take on a group of `nranks` on links of `class`: what a
/// tuning file measured on these links, else the built-in cap (`crate::launch::tables`); None:
/// the group's own cap.
pub(crate) fn grid_cap(class: LinkClass, family: Family, nranks: i32, tuned: Option<&Tuning>) -> Option<u32> {
    tuned.and_then(|t| t.grid(class, nranks, family)).or_else(|| builtin_grid_cap(class, family, nranks))
}

/// AUTO's families from the one that serves the smallest messages to the one that serves the
/// largest (ties in `Family::ALL`'s order): a family AUTO chose that cannot serve a call falls
/// back along it. Sorted in place: enqueue allocates nothing.
fn auto_order() -> [Family; Family::ALL.len()] {
    let mut order = Family::ALL;
    let position = |f: Family| Family::ALL.iter().position(|&g| g == f).unwrap_or(0);
    order.sort_unstable_by_key(|&f| (f.max_bytes(u64::MAX), position(f)));
    order
}

/// One all-reduce call as every rank sees it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub tp_size: i32,
    pub dtype: DataType,
    /// Bytes of the reduced tensor, and for the fused op its `(tokens, hidden)`.
    pub message: Message,
    /// Input and output 16-byte aligned (the kernels' requirement).
    pub aligned: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `tp_size <= 1`: no peers, the output is a copy of the input (Edge-LLM's passthrough).
    Copy,
    /// The registered `ncclAllReduce`.
    Nccl,
    Custom(Family),
    /// The fused op as the family's plain all-reduce, then the residual + RMSNorm kernel.
    Split(Family),
}

/// Why a custom family did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No group: ranks not all in this process, no peer access, or not registered yet.
    NoWorkspace,
    /// The group has a different rank count than the plugin's tp_size.
    RankMismatch,
    Unaligned,
    /// Over the workspace, or no kernel for this dtype and rank count.
    NotServed,
    /// Another stream than the one that runs this rank's custom all-reduces (one stream per
    /// group: `Group::claim_stream`).
    OtherStream,
    /// A family that loads from its peers, on a group where none may run ([`pulls_enabled`]).
    NoPeerReads,
}

impl Fallback {
    pub fn describe(self) -> &'static str {
        match self {
            Fallback::NoWorkspace => "no custom workspace for this device (ranks not all registered in this process, or no peer access)",
            Fallback::RankMismatch => "the plugin's tp_size differs from the registered communicator's rank count",
            Fallback::Unaligned => "input or output is not 16-byte aligned",
            Fallback::NotServed => "the message is larger than the workspace, or no kernel exists for this type and rank count",
            Fallback::OtherStream => "another stream than the one that runs this rank's custom all-reduces (one stream per group: release and set up the workspaces again to move it)",
            Fallback::NoPeerReads => "it loads from its peers, and on this group's links none may (PCIe: only where a tuning file measured on these links, or EDGELLM_ALLREDUCE_STRATEGY, chose such a family; or the driver reports peer reads unsupported)",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub path: Path,
    /// Set when the requested path could not run.
    pub fallback: Option<Fallback>,
    pub requested: Requested,
}

/// The path of `call` on a device whose group (if any) is `group`; AUTO with the tuning file's
/// tables where one is loaded ([`crate::launch::tuning::active`]).
pub fn choose(requested: Requested, call: &Call, group: Option<&dyn Fits>) -> Decision {
    choose_tuned(requested, call, group, crate::launch::tuning::active())
}

/// [`choose`] with `tuned` as the tuning file (None: the built-in tables).
pub(crate) fn choose_tuned(
    requested: Requested,
    call: &Call,
    group: Option<&dyn Fits>,
    tuned: Option<&Tuning>,
) -> Decision {
    let decide = |path, fallback| Decision { path, fallback, requested };
    if call.tp_size <= 1 {
        return decide(Path::Copy, None);
    }
    let (one, auto);
    let families: &[Family] = match requested {
        Requested::Nccl => return decide(Path::Nccl, None),
        Requested::Family(f) => {
            one = [f];
            &one
        }
        Requested::Auto => {
            auto = auto_order();
            &auto
        }
    };
    let Some(group) = group else { return decide(Path::Nccl, Some(Fallback::NoWorkspace)) };
    let class = group.link_class();
    if class == LinkClass::NoPeer {
        return decide(Path::Nccl, Some(Fallback::NoWorkspace));
    }
    if group.nranks() != call.tp_size {
        return decide(Path::Nccl, Some(Fallback::RankMismatch));
    }
    if !call.aligned {
        return decide(Path::Nccl, Some(Fallback::Unaligned));
    }
    // The families to try, smallest first from the one asked for, and how they run.
    let (first, split) = match requested {
        Requested::Auto => match auto_choice(group.nranks(), call.dtype, &call.message, class, tuned) {
            FusedChoice::Nccl => return decide(Path::Nccl, None),
            FusedChoice::Fused(f) => (f, false),
            FusedChoice::Split(f) => (f, true),
        },
        _ => (families[0], false),
    };
    let plain = Message { rows: None, ..call.message };
    let message = if split { &plain } else { &call.message };
    let op = if message.rows.is_some() { Op::ResidualRmsNorm } else { Op::AllReduce };
    // A family that loads from its peers runs only where the group allows it (`pulls_enabled`);
    // over PCIe AUTO takes its table's choice or NCCL, never another family (the PCIe model:
    // `crate::launch::tables`).
    let loads = |f: Family| !f.writes_into_peers(op, group.nranks());
    if !group.pulls() && loads(first) && requested != Requested::Auto {
        return decide(Path::Nccl, Some(Fallback::NoPeerReads));
    }
    let allowed = |f: Family| (f == first || class != LinkClass::Pcie) && (group.pulls() || !loads(f));
    let start = families.iter().position(|f| *f == first).unwrap_or(0);
    let served = families[start..].iter().find(|f| allowed(**f) && group.serves(**f, call.dtype, message));
    match served {
        Some(f) if split => decide(Path::Split(*f), None),
        Some(f) => decide(Path::Custom(*f), None),
        None if requested == Requested::Auto => decide(Path::Nccl, None),
        None => decide(Path::Nccl, Some(Fallback::NotServed)),
    }
}

#[cfg(test)]
mod tests;
