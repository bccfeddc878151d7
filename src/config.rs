//! Every environment knob of the library and every default, read once per process into one
//! [`Config`] (a leaf: it imports only the kernels' constants and the log; [`get`] logs, once,
//! every value that was set but not understood, by name). The modules that need a knob read it
//! here themselves; knobs whose values are another room's words (a strategy, a self-test fault
//! spec) are kept as text and understood there.

use crate::contract::EAR_MAX_BLOCKS;
use crate::log::Severity;
use std::sync::OnceLock;

/// The largest `EDGELLM_ALLREDUCE_WORKSPACE_BYTES` taken (1 TiB): the workspace rule's
/// arithmetic stays far from overflowing.
pub(crate) const MAX_WORKSPACE_BYTES: u64 = 1 << 40;

/// `EDGELLM_ALLREDUCE_TIMEOUT_MS` when unset: generous next to any all-reduce (microseconds to
/// milliseconds), short next to a person waiting for a hung job.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// `EDGELLM_ALLREDUCE_SELFTEST_MS` when unset: how long the peer self-test's kernel waits for its
/// peers' tokens (`crate::group::selftest`). A healthy group passes in microseconds; the bound is what a
/// failing one costs, and covers the skew between the ranks' launches.
pub(crate) const DEFAULT_SELFTEST_MS: u64 = 50;

/// The largest `EDGELLM_ALLREDUCE_SELFTEST_MS` taken (one minute).
pub(crate) const MAX_SELFTEST_MS: u64 = 60_000;

/// The largest message of the custom kernels when `EDGELLM_ALLREDUCE_WORKSPACE_BYTES` is unset:
/// the seed's `getMaxRequiredWorkspaceSize`, 16 MB up to 2 ranks, 8 MB above.
const DEFAULT_MESSAGE_BYTES: [(i32, u64); 2] = [(2, 16_000_000), (i32::MAX, 8_000_000)];

/// The process's configuration (docs/CONFIGURATION.md, "Environment").
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// `EDGELLM_ALLREDUCE_STRATEGY`, trimmed (NCCL, AUTO or a family's name, any case:
    /// `crate::launch::strategy::Requested::configured` reads it): overrides every plugin's
    /// field; NCCL also keeps workspaces from being allocated.
    pub strategy: Option<String>,
    /// `EDGELLM_ALLREDUCE_WORKSPACE_BYTES`, rounded up to 16: the largest message of the custom
    /// kernels (default: the seed's rule, group::max_message_bytes).
    pub workspace_bytes: Option<u64>,
    /// `EDGELLM_ALLREDUCE_EXCHANGE=register`: the IPC exchange at registration (a collective).
    pub exchange_at_register: bool,
    /// `EDGELLM_ALLREDUCE_MAX_BLOCKS`: the grid cap, 1..=EAR_MAX_BLOCKS.
    pub max_blocks: Option<u32>,
    /// `EDGELLM_ALLREDUCE_TIMEOUT_MS`: the longest a kernel waits for a peer before it gives up
    /// (kernels/wait.cuh); 0: no bound.
    pub timeout_ms: u64,
    /// `EDGELLM_ALLREDUCE_SELFTEST_MS`: the bound of the peer self-test a group passes before its
    /// custom kernels are trusted (`crate::group::selftest`); 0: no self-test, which is unsafe: a
    /// fabric that drops or garbles peer traffic then shows as hangs or wrong sums.
    pub selftest_ms: u64,
    /// `EDGELLM_ALLREDUCE_PDL=0` turns programmatic dependent launch off (a debugging switch).
    pub pdl: bool,
    /// `EDGELLM_ALLREDUCE_LOG_LEVEL`: stderr logging when no TensorRT logger was given.
    pub log_level: Severity,
    /// `EDGELLM_ALLREDUCE_TUNING`: the tuning file AUTO reads (`crate::launch::tuning`; unset or empty:
    /// `edgellm-allreduce-tuning.txt` beside the library, if there is one).
    pub tuning_file: Option<std::path::PathBuf>,
    /// `EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT`: a test hook, not a user setting
    /// (docs/CONFIGURATION.md lists no such knob): faults injected into the peer self-test of every
    /// group this process forms, so that the multi-process path can be tested on one GPU
    /// (tests/cpp/multiprocess_one_gpu_test.cpp; `crate::group::selftest::SelfTestInjection`
    /// reads it). Unset or empty: none.
    pub selftest_fault: Option<String>,
    /// Values that were set but not understood, one line each (logged once, then ignored).
    pub problems: Vec<String>,
}

impl Config {
    /// Parses the knobs from `var` (the environment, or a table in tests).
    pub(crate) fn from(var: impl Fn(&str) -> Option<String>) -> Config {
        let mut problems = Vec::new();
        let mut parsed = |name: &str, expected: &str, parse: &dyn Fn(&str) -> bool| {
            let value = var(name)?;
            if !parse(value.trim()) {
                problems.push(format!("{name}={value} is not {expected}: ignored"));
                return None;
            }
            Some(value.trim().to_owned())
        };
        let text = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let strategy = text("EDGELLM_ALLREDUCE_STRATEGY");
        let workspace_bytes = parsed("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "a byte count up to 2^40", &|v| {
            v.parse::<u64>().is_ok_and(|b| b <= MAX_WORKSPACE_BYTES)
        })
        .and_then(|v| v.parse::<u64>().ok())
        .map(|b| b.div_ceil(16) * 16);
        let max_blocks = parsed("EDGELLM_ALLREDUCE_MAX_BLOCKS", "a CTA count from 1 to 128", &|v| {
            v.parse::<u32>().is_ok_and(|b| (1..=EAR_MAX_BLOCKS).contains(&b))
        })
        .and_then(|v| v.parse().ok());
        let timeout_ms = parsed("EDGELLM_ALLREDUCE_TIMEOUT_MS", "a number of milliseconds (0: no bound)", &|v| {
            v.parse::<u64>().is_ok()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_TIMEOUT_MS);
        let selftest_ms = parsed(
            "EDGELLM_ALLREDUCE_SELFTEST_MS",
            "a number of milliseconds up to 60000 (0: no self-test, unsafe)",
            &|v| v.parse::<u64>().is_ok_and(|ms| ms <= MAX_SELFTEST_MS),
        )
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SELFTEST_MS);
        let log_level = parsed("EDGELLM_ALLREDUCE_LOG_LEVEL", "one of error, warning, info, verbose", &|v| {
            parse_severity(v).is_some()
        })
        .and_then(|v| parse_severity(&v))
        .unwrap_or(Severity::Warning);
        let exchange_at_register = parsed("EDGELLM_ALLREDUCE_EXCHANGE", "register", &|v| v == "register").is_some();
        let pdl = parsed("EDGELLM_ALLREDUCE_PDL", "0 or 1", &|v| v == "0" || v == "1").is_none_or(|v| v != "0");
        // A path: any text but the empty one (which means unset, as for a shell's VAR=).
        let tuning_file =
            var("EDGELLM_ALLREDUCE_TUNING").filter(|v| !v.trim().is_empty()).map(std::path::PathBuf::from);
        let selftest_fault = text("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT");
        Config {
            strategy,
            workspace_bytes,
            exchange_at_register,
            max_blocks,
            timeout_ms,
            selftest_ms,
            pdl,
            log_level,
            tuning_file,
            selftest_fault,
            problems,
        }
    }
}

fn parse_severity(v: &str) -> Option<Severity> {
    match v {
        "error" => Some(Severity::Error),
        "warning" => Some(Severity::Warning),
        "info" => Some(Severity::Info),
        "verbose" => Some(Severity::Verbose),
        _ => None,
    }
}

impl Config {
    /// The largest message of the custom kernels for a communicator of `nranks`.
    pub(crate) fn max_message_bytes(&self, nranks: i32) -> u64 {
        let default = DEFAULT_MESSAGE_BYTES.iter().find(|(n, _)| nranks <= *n).map_or(8_000_000, |d| d.1);
        self.workspace_bytes.unwrap_or(default)
    }

    /// The grid cap asked for: `EDGELLM_ALLREDUCE_MAX_BLOCKS`, else the kernels' maximum.
    pub(crate) fn max_blocks(&self) -> u32 {
        self.max_blocks.unwrap_or(EAR_MAX_BLOCKS).clamp(1, EAR_MAX_BLOCKS)
    }

    /// `EDGELLM_ALLREDUCE_TIMEOUT_MS` in nanoseconds (0: no bound), at most 2^62 (146 years), so
    /// that the kernels' deadline (the clock plus this) never wraps.
    pub(crate) fn timeout_ns(&self) -> u64 {
        self.timeout_ms.saturating_mul(1_000_000).min(1 << 62)
    }
}

/// The environment's configuration, read on first use; the first reader logs, once, every value
/// that was set but not understood, and sets the log's stderr threshold.
pub(crate) fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    static REPORTED: std::sync::Once = std::sync::Once::new();
    let config = CONFIG.get_or_init(|| Config::from(|name| std::env::var(name).ok()));
    REPORTED.call_once(|| {
        crate::log::set_stderr_level(config.log_level);
        config.problems.iter().for_each(|p| crate::log::warning(p));
    });
    config
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
        assert_eq!(c.tuning_file, None);
        assert_eq!(from(&[("EDGELLM_ALLREDUCE_TUNING", " ")]).tuning_file, None, "empty: unset");
        assert_eq!(c.timeout_ms, 10_000);
        assert_eq!(c.selftest_ms, 50);
        assert_eq!(c.selftest_fault, None);
        assert_eq!(from(&[("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT", " ")]).selftest_fault, None, "empty: unset");
    }

    #[test]
    fn every_knob_is_parsed() {
        let c = from(&[
            ("EDGELLM_ALLREDUCE_STRATEGY", " lamport "),
            ("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT", "drop:0>1 "),
            ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "1000"),
            ("EDGELLM_ALLREDUCE_MAX_BLOCKS", "64"),
            ("EDGELLM_ALLREDUCE_EXCHANGE", "register"),
            ("EDGELLM_ALLREDUCE_PDL", "0"),
            ("EDGELLM_ALLREDUCE_LOG_LEVEL", "verbose"),
            ("EDGELLM_ALLREDUCE_TIMEOUT_MS", "0"),
            ("EDGELLM_ALLREDUCE_TUNING", "/opt/ear/tuning.txt"),
            ("EDGELLM_ALLREDUCE_SELFTEST_MS", "0"),
        ]);
        assert_eq!(c.timeout_ms, 0, "0: no bound");
        assert_eq!(c.tuning_file, Some(std::path::PathBuf::from("/opt/ear/tuning.txt")));
        assert_eq!(c.selftest_ms, 0, "0: no self-test");
        assert_eq!(from(&[("EDGELLM_ALLREDUCE_SELFTEST_MS", " 250 ")]).selftest_ms, 250);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(c.strategy.as_deref(), Some("lamport"), "understood by the strategy");
        assert_eq!(c.selftest_fault.as_deref(), Some("drop:0>1"), "understood by the self-test");
        assert_eq!(c.workspace_bytes, Some(1008), "rounded up to 16 bytes");
        assert_eq!(c.max_blocks, Some(64));
        assert!(c.exchange_at_register && !c.pdl);
        assert_eq!(c.log_level, Severity::Verbose);
    }

    #[test]
    fn values_not_understood_are_reported_by_name_and_ignored() {
        let bad = [
            ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "garbage"),
            ("EDGELLM_ALLREDUCE_MAX_BLOCKS", "abc"),
            ("EDGELLM_ALLREDUCE_TIMEOUT_MS", "-5"),
            ("EDGELLM_ALLREDUCE_SELFTEST_MS", "fast"),
            ("EDGELLM_ALLREDUCE_LOG_LEVEL", "loud"),
            ("EDGELLM_ALLREDUCE_EXCHANGE", "always"),
            ("EDGELLM_ALLREDUCE_PDL", "off"),
        ];
        let c = from(&bad);
        assert_eq!(c, from(&[]).with_problems(c.problems.clone()), "every value ignored: the defaults");
        assert_eq!(c.problems.len(), bad.len(), "{:?}", c.problems);
        for ((name, value), problem) in bad.iter().zip(&c.problems) {
            assert!(problem.starts_with(&format!("{name}={value} is not ")), "{problem}");
        }
    }

    #[test]
    fn values_out_of_range_are_reported_and_ignored() {
        let c = from(&[
            ("EDGELLM_ALLREDUCE_MAX_BLOCKS", "0"),
            ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "18446744073709551615"),
        ]);
        assert_eq!((c.max_blocks, c.workspace_bytes), (None, None));
        assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
        let c = from(&[("EDGELLM_ALLREDUCE_MAX_BLOCKS", "129")]);
        assert_eq!(c.max_blocks, None);
        let c = from(&[("EDGELLM_ALLREDUCE_SELFTEST_MS", "60001")]);
        assert_eq!((c.selftest_ms, c.problems.len()), (DEFAULT_SELFTEST_MS, 1), "over a minute: the default");
        let c =
            from(&[("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "1099511627776"), ("EDGELLM_ALLREDUCE_MAX_BLOCKS", "128")]);
        assert_eq!((c.workspace_bytes, c.max_blocks), (Some(1 << 40), Some(128)), "the bounds themselves are taken");
    }

    #[test]
    fn defaults_live_here() {
        let c = from(&[]);
        assert_eq!(
            (c.max_message_bytes(2), c.max_message_bytes(4), c.max_message_bytes(16)),
            (16_000_000, 8_000_000, 8_000_000)
        );
        assert_eq!(c.max_blocks(), EAR_MAX_BLOCKS);
        assert_eq!(c.timeout_ns(), 10_000_000_000);
        let c = from(&[
            ("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", "1000"),
            ("EDGELLM_ALLREDUCE_TIMEOUT_MS", "18446744073709551615"),
        ]);
        assert_eq!(c.max_message_bytes(2), 1008);
        assert_eq!(c.timeout_ns(), 1 << 62, "the deadline never wraps");
    }

    impl Config {
        fn with_problems(mut self, problems: Vec<String>) -> Config {
            self.problems = problems;
            self
        }
    }
}
