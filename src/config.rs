//! Every environment knob of the library, read once per process into one [`Config`] (a leaf:
//! it imports nothing of ours; `crate::config()` logs what could not be parsed).

use std::sync::OnceLock;

/// A strategy as asked for: the plugin's `strategy` field, or `EDGELLM_ALLREDUCE_STRATEGY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Nccl,
    OneShot,
    TwoShot,
    /// Only through the environment: the seed's enum has no value for it.
    Lamport,
    Auto,
}

/// TensorRT's `ILogger::Severity` values; the stderr threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub enum Severity {
    Error = 1,
    Warning = 2,
    Info = 3,
    Verbose = 4,
}

/// The process's configuration (README.md, "Environment").
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// `EDGELLM_ALLREDUCE_STRATEGY` (NCCL, ONESHOT, TWOSHOT, LAMPORT, AUTO; any case): overrides
    /// every plugin's field; NCCL also keeps workspaces from being allocated.
    pub strategy: Option<Requested>,
    /// `EDGELLM_ALLREDUCE_WORKSPACE_BYTES`, rounded up to 16: the largest message of the custom
    /// kernels (default: the seed's rule, group::max_message_bytes).
    pub workspace_bytes: Option<u64>,
    /// `EDGELLM_ALLREDUCE_EXCHANGE=register`: the IPC exchange at registration (a collective).
    pub exchange_at_register: bool,
    /// `EDGELLM_ALLREDUCE_MAX_BLOCKS`: the grid cap (the group clamps it to 1..=EAR_MAX_BLOCKS).
    pub max_blocks: Option<u32>,
    /// `EDGELLM_ALLREDUCE_PDL=0` turns programmatic dependent launch off (a debugging switch).
    pub pdl: bool,
    /// `EDGELLM_ALLREDUCE_LOG_LEVEL`: stderr logging when no TensorRT logger was given.
    pub log_level: Severity,
    /// Values that were set but not understood, one line each (logged once, then ignored).
    pub problems: Vec<String>,
}

impl Config {
    /// Parses the knobs from `var` (the environment, or a table in tests).
    pub fn from(var: impl Fn(&str) -> Option<String>) -> Config {
        let mut problems = Vec::new();
        let mut parsed = |name: &str, expected: &str, parse: &dyn Fn(&str) -> bool| {
            let value = var(name)?;
            if !parse(value.trim()) {
                problems.push(format!("{name}={value} is not {expected}: ignored"));
                return None;
            }
            Some(value.trim().to_owned())
        };
        let strategy = parsed("EDGELLM_ALLREDUCE_STRATEGY", "one of NCCL, ONESHOT, TWOSHOT, LAMPORT, AUTO", &|v| {
            parse_requested(v).is_some()
        })
        .and_then(|v| parse_requested(&v));
        let workspace_bytes = parsed("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "a byte count", &|v| v.parse::<u64>().is_ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|b| b.div_ceil(16) * 16);
        let max_blocks = parsed("EDGELLM_ALLREDUCE_MAX_BLOCKS", "a CTA count", &|v| v.parse::<u32>().is_ok())
            .and_then(|v| v.parse().ok());
        let log_level = match var("EDGELLM_ALLREDUCE_LOG_LEVEL").as_deref() {
            Some("error") => Severity::Error,
            Some("info") => Severity::Info,
            Some("verbose") => Severity::Verbose,
            _ => Severity::Warning,
        };
        Config {
            strategy,
            workspace_bytes,
            exchange_at_register: var("EDGELLM_ALLREDUCE_EXCHANGE").is_some_and(|v| v == "register"),
            max_blocks,
            pdl: var("EDGELLM_ALLREDUCE_PDL").is_none_or(|v| v != "0"),
            log_level,
            problems,
        }
    }
}

pub(crate) fn parse_requested(v: &str) -> Option<Requested> {
    match v.trim().to_ascii_uppercase().as_str() {
        "NCCL" => Some(Requested::Nccl),
        "ONESHOT" => Some(Requested::OneShot),
        "TWOSHOT" => Some(Requested::TwoShot),
        "LAMPORT" => Some(Requested::Lamport),
        "AUTO" => Some(Requested::Auto),
        _ => None,
    }
}

/// The environment's configuration, read on first use.
pub(crate) fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from(|name| std::env::var(name).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Config {
        Config::from(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let c = from(&[]);
        assert_eq!((c.strategy, c.workspace_bytes, c.max_blocks), (None, None, None));
        assert!(c.pdl && !c.exchange_at_register && c.problems.is_empty());
        assert_eq!(c.log_level, Severity::Warning);
    }

    #[test]
    fn every_knob_is_parsed() {
        let c = from(&[
            ("EDGELLM_ALLREDUCE_STRATEGY", " lamport "),
            ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "1000"),
            ("EDGELLM_ALLREDUCE_MAX_BLOCKS", "64"),
            ("EDGELLM_ALLREDUCE_EXCHANGE", "register"),
            ("EDGELLM_ALLREDUCE_PDL", "0"),
            ("EDGELLM_ALLREDUCE_LOG_LEVEL", "verbose"),
        ]);
        assert_eq!(c.strategy, Some(Requested::Lamport));
        assert_eq!(c.workspace_bytes, Some(1008), "rounded up to 16 bytes");
        assert_eq!(c.max_blocks, Some(64));
        assert!(c.exchange_at_register && !c.pdl);
        assert_eq!(c.log_level, Severity::Verbose);
    }

    #[test]
    fn values_not_understood_are_reported_and_ignored() {
        let c = from(&[("EDGELLM_ALLREDUCE_STRATEGY", "fast"), ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "16M")]);
        assert_eq!((c.strategy, c.workspace_bytes), (None, None));
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        assert!(c.problems[0].contains("EDGELLM_ALLREDUCE_STRATEGY=fast"));
    }

    #[test]
    fn strategy_names_parse() {
        assert_eq!(parse_requested("oneshot"), Some(Requested::OneShot));
        assert_eq!(parse_requested(" NCCL "), Some(Requested::Nccl));
        assert_eq!(parse_requested("lamport"), Some(Requested::Lamport));
        assert_eq!(parse_requested("fast"), None);
    }
}
