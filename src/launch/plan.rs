//! One rank's plan of one call, decided in one place: [`plan`] is a pure function of the call,
//! what the rank knows when it comes ([`Facts`]) and the tuning file. It gives the path (a copy,
//! NCCL, a custom family, or a family's plain sum then the norm kernel) and why, and each kernel
//! to launch with its grid, block and flags ([`Plan`]). Grid, block and flags come from
//! `ear_plan_of` (`kernels/allreduce_params.h`, through `kernels/layout.c`) on the family's rule:
//! the kernel simulations call the same rule, and since it depends on what every rank shares,
//! every rank launches the same grid. `crate::group::run` gathers the facts, asks, and executes.

use super::family::{Family, Op};
use super::strategy::{self, Call, Decision, Fallback, Path, Requested};
use super::tuning::Tuning;
use super::{Fits, Message};
use crate::contract::{EarCallFacts, EarPlan, EarRule, EAR_OP_ALLREDUCE, EAR_OP_RESIDUAL_RMSNORM};
use crate::link::LinkClass;
use crate::tensor::DataType;

/// What one rank knows, besides the call itself, when it plans it.
#[derive(Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// Its device's group (None: NCCL).
    pub group: Option<&'a dyn Fits>,
    /// The group's grid cap.
    pub max_blocks: u32,
    /// Whether the stream of the call may run the group's kernels (the first stream that ran
    /// one owns the rank: `crate::group::Group::claim_stream`).
    pub stream_owns_rank: bool,
    /// What the flags of a plain sum depend on.
    pub call: EarCallFacts,
    /// SMs of the device (the norm kernel's grid).
    pub sm_count: i32,
}

/// One rank's plan of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub decision: Decision,
    /// The family's kernel (`Custom`: the call's op; `Split`: its plain sum).
    pub kernel: Option<(Family, EarPlan)>,
    /// The residual + RMSNorm kernel after a plain sum (the fused op on NCCL, or split).
    pub norm: Option<EarPlan>,
}

/// The plan of `call`, requested as `requested`, on a rank that knows `facts`, with `tuned` as
/// the tuning file (None: the built-in tables).
pub(crate) fn plan(requested: Requested, call: &Call, facts: &Facts, tuned: Option<&Tuning>) -> Plan {
    let mut decision = strategy::choose_tuned(requested, call, facts.group, tuned);
    let custom = matches!(decision.path, Path::Custom(_) | Path::Split(_));
    if custom && !facts.stream_owns_rank {
        decision = Decision { path: Path::Nccl, fallback: Some(Fallback::OtherStream), requested };
    }
    let nranks = facts.group.map_or(call.tp_size, |g| g.nranks());
    let class = facts.group.map_or(LinkClass::NoPeer, |g| g.link_class());
    let plain = Message { rows: None, ..call.message };
    let kernel = match decision.path {
        Path::Custom(f) => Some(f).zip(Some(&call.message)),
        Path::Split(f) => Some(f).zip(Some(&plain)),
        Path::Copy | Path::Nccl => None,
    }
    .map(|(f, message)| {
        // The family's grid on these links (a tuning file's, else the built-in one), within the
        // group's cap.
        let cap = strategy::grid_cap(class, f, nranks, tuned).map_or(facts.max_blocks, |c| c.min(facts.max_blocks));
        (f, kernel(f, call.dtype, message, nranks, cap, facts.call))
    });
    let norm = match (decision.path, call.message.rows) {
        (Path::Split(_) | Path::Nccl, Some((tokens, hidden))) => Some(norm(tokens, hidden, call.dtype, facts.sm_count)),
        _ => None,
    };
    Plan { decision, kernel, norm }
}

/// The plan of `family`'s kernel for `message` among `nranks` ranks, at most `max_blocks` CTAs
/// (clamped to the kernels' maximum), with the flags `facts` give a plain sum.
pub(crate) fn kernel(
    family: Family,
    dtype: DataType,
    message: &Message,
    nranks: i32,
    max_blocks: u32,
    facts: EarCallFacts,
) -> EarPlan {
    let elem = dtype.size() as u32;
    let (op, tokens, hidden) = match message.rows {
        Some((tokens, hidden)) => (EAR_OP_RESIDUAL_RMSNORM, tokens, hidden),
        None => (EAR_OP_ALLREDUCE, 0, 0),
    };
    let count = message.bytes / elem as u64;
    let rule = family.describe().rule;
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_plan(rule, family.id(), op, count, tokens, hidden, elem, nranks, max_blocks, facts) }
}

/// The plan of the residual + RMSNorm kernel alone on `tokens` rows of `hidden` (one CTA per
/// row, up to 4 waves of the device's `sm_count` SMs: it waits on nothing, so any grid is right).
pub(crate) fn norm(tokens: u64, hidden: u32, dtype: DataType, sm_count: i32) -> EarPlan {
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_norm_plan(tokens, hidden, dtype.size() as u32, sm_count) }
}

/// The op a plan's kernel computes.
pub(crate) fn op_of(plan: &EarPlan) -> Op {
    if plan.op == EAR_OP_RESIDUAL_RMSNORM {
        Op::ResidualRmsNorm
    } else {
        Op::AllReduce
    }
}

/// The op of a message: the fused op when it has rows.
pub(crate) fn op(message: &Message) -> Op {
    if message.rows.is_some() {
        Op::ResidualRmsNorm
    } else {
        Op::AllReduce
    }
}

/// Whether peers of a group of one process may read a rank's input in place, given where it
/// lies (`cuda::device_memory`: its device, and whether the peer access between primary
/// contexts reaches it): on the rank's own device, and reachable, or every rank on that device.
pub(crate) fn peers_reach(device: i32, one_device: bool, memory: Option<(i32, bool)>) -> bool {
    memory.is_some_and(|(at, reachable)| at == device && (reachable || one_device))
}

// kernels/layout.c.
extern "C" {
    #[allow(clippy::too_many_arguments)] // the C rule's arguments
    fn ear_plan(
        rule: EarRule,
        family: i32,
        op: i32,
        count: u64,
        tokens: u64,
        hidden: u32,
        elem: u32,
        nranks: i32,
        max_blocks: u32,
        facts: EarCallFacts,
    ) -> EarPlan;
    fn ear_norm_plan(tokens: u64, hidden: u32, elem: u32, sm_count: i32) -> EarPlan;
}

#[cfg(test)]
mod tests;
