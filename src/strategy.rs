//! Which path runs an all-reduce. The custom intra-node kernels slot in here; until they are
//! ready, every strategy (NCCL, ONESHOT, TWOSHOT, AUTO) takes the NCCL path, as Edge-LLM does.

use crate::fields::PluginConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `tp_size <= 1`: no peers, the output is a copy of the input (Edge-LLM's passthrough).
    Copy,
    /// The registered `ncclAllReduce`.
    Nccl,
}

pub fn choose(config: &PluginConfig) -> Path {
    if config.tp_size <= 1 {
        Path::Copy
    } else {
        Path::Nccl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_rank_copies_and_every_strategy_uses_nccl() {
        assert_eq!(choose(&PluginConfig::with_tp_size(1).unwrap()), Path::Copy);
        for s in [crate::fields::Strategy::Nccl, crate::fields::Strategy::OneShot, crate::fields::Strategy::TwoShot, crate::fields::Strategy::Auto] {
            let mut c = PluginConfig::with_tp_size(4).unwrap();
            c.strategy = s;
            assert_eq!(choose(&c), Path::Nccl, "{s:?}");
        }
    }
}
