//! Every environment knob of the library, read once per process into one [`Config`] (a leaf:
//! it imports only the kernels' constants; `crate::config()` logs, once, every value that was
//! set but not understood, by name).

use crate::contract::{EAR_MAX_BLOCKS, EAR_MAX_RANKS};
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
pub(crate) enum Severity {
    Error = 1,
    Warning = 2,
    Info = 3,
    Verbose = 4,
}

/// The process's configuration (docs/CONFIGURATION.md, "Environment").
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
    /// (tests/cpp/multiprocess_one_gpu_test.cpp).
    /// Unset, empty or malformed (one warning): none.
    pub selftest_fault: Option<SelfTestFault>,
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
        let strategy = parsed("EDGELLM_ALLREDUCE_STRATEGY", "one of NCCL, ONESHOT, TWOSHOT, LAMPORT, AUTO", &|v| {
            parse_requested(v).is_some()
        })
        .and_then(|v| parse_requested(&v));
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
        let selftest_fault = match var("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => match SelfTestFault::parse(&v) {
                Ok(fault) => Some(fault),
                Err(why) => {
                    problems.push(format!(
                        "EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT={v} is not a fault spec ({why}): ignored"
                    ));
                    None
                }
            },
        };
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

/// Faults for the peer self-test (a test hook: [`Config::selftest_fault`]), as rank pairs; the
/// self-test applies each rank's share (`crate::group::selftest::SelfTestInjection`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SelfTestFault {
    /// `drop:A>B`: rank A does not write its token into rank B's workspace.
    pub drop_writes: Vec<(i32, i32)>,
    /// `garble:A>B`: rank A writes a wrong token into rank B's workspace.
    pub garble_writes: Vec<(i32, i32)>,
    /// `garble-slot:R`: rank R writes a wrong token into its own slot.
    pub garble_own_slot: Vec<i32>,
    /// `not-launched:R`: rank R's kernel is never launched.
    pub not_launched: Vec<i32>,
    /// `host-wait:MS`: every rank's host waits MS milliseconds for its kernel instead of the
    /// bound plus its grace; shorter than `EDGELLM_ALLREDUCE_SELFTEST_MS`, a kernel still runs
    /// when its host gives up (what a peer load that never returns looks like).
    pub host_wait_ms: Option<u64>,
}

impl SelfTestFault {
    /// Parses a comma-separated list of `drop:A>B`, `garble:A>B`, `garble-slot:R`,
    /// `not-launched:R` (ranks below `EAR_MAX_RANKS`, A != B), `host-wait:MS`; Err says what is wrong.
    pub(crate) fn parse(spec: &str) -> std::result::Result<SelfTestFault, String> {
        let rank = |v: &str| -> std::result::Result<i32, String> {
            v.trim()
                .parse::<i32>()
                .ok()
                .filter(|r| (0..EAR_MAX_RANKS as i32).contains(r))
                .ok_or_else(|| format!("'{}' is not a rank from 0 to {}", v.trim(), EAR_MAX_RANKS - 1))
        };
        let pair = |v: &str| -> std::result::Result<(i32, i32), String> {
            let (a, b) = v.split_once('>').ok_or_else(|| format!("'{}' is not a pair FROM>TO", v.trim()))?;
            let (a, b) = (rank(a)?, rank(b)?);
            if a == b {
                return Err(format!("{a}>{b}: a rank's own slot is garble-slot:{a}"));
            }
            Ok((a, b))
        };
        let mut fault = SelfTestFault::default();
        for item in spec.split(',') {
            let (kind, value) = item.split_once(':').unwrap_or((item, ""));
            match kind.trim() {
                "drop" => fault.drop_writes.push(pair(value)?),
                "garble" => fault.garble_writes.push(pair(value)?),
                "garble-slot" => fault.garble_own_slot.push(rank(value)?),
                "not-launched" => fault.not_launched.push(rank(value)?),
                "host-wait" => {
                    let ms = value.trim().parse::<u64>().ok().filter(|ms| *ms <= MAX_SELFTEST_MS);
                    fault.host_wait_ms = Some(ms.ok_or_else(|| {
                        format!("'{}' is not a wait in milliseconds up to {MAX_SELFTEST_MS}", value.trim())
                    })?);
                }
                other => {
                    return Err(format!(
                        "'{other}' is not drop:A>B, garble:A>B, garble-slot:R, not-launched:R or host-wait:MS"
                    ));
                }
            }
        }
        Ok(fault)
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
        assert_eq!(c.strategy, Some(Requested::Lamport));
        assert_eq!(c.workspace_bytes, Some(1008), "rounded up to 16 bytes");
        assert_eq!(c.max_blocks, Some(64));
        assert!(c.exchange_at_register && !c.pdl);
        assert_eq!(c.log_level, Severity::Verbose);
    }

    #[test]
    fn values_not_understood_are_reported_by_name_and_ignored() {
        let bad = [
            ("EDGELLM_ALLREDUCE_STRATEGY", "XYZ"),
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
    fn the_selftest_fault_hook_parses_every_kind() {
        let c = from(&[(
            "EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT",
            "drop:0>1, garble:2>3,garble-slot:1,not-launched:3,drop:15>0,host-wait:25",
        )]);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(
            c.selftest_fault,
            Some(SelfTestFault {
                drop_writes: vec![(0, 1), (15, 0)],
                garble_writes: vec![(2, 3)],
                garble_own_slot: vec![1],
                not_launched: vec![3],
                host_wait_ms: Some(25),
            })
        );
        assert_eq!(SelfTestFault::parse(" not-launched : 1 ").map(|f| f.not_launched), Ok(vec![1]));
    }

    #[test]
    fn a_malformed_selftest_fault_is_one_problem_and_no_injection() {
        for bad in [
            "drop",
            "drop:0",
            "drop:0>",
            "drop:0>0",
            "drop:0>16",
            "drop:-1>0",
            "garble:a>b",
            "not-launched:",
            "lose:0>1",
            "drop:0>1,",
        ] {
            let c = from(&[("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT", bad)]);
            assert_eq!(c.selftest_fault, None, "{bad}");
            assert_eq!(c.problems.len(), 1, "{bad}: {:?}", c.problems);
            assert!(c.problems[0]
                .starts_with(&format!("EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT={bad} is not a fault spec (")));
        }
    }

    #[test]
    fn strategy_names_parse() {
        assert_eq!(parse_requested("oneshot"), Some(Requested::OneShot));
        assert_eq!(parse_requested(" NCCL "), Some(Requested::Nccl));
        assert_eq!(parse_requested("lamport"), Some(Requested::Lamport));
        assert_eq!(parse_requested("fast"), None);
    }

    impl Config {
        fn with_problems(mut self, problems: Vec<String>) -> Config {
            self.problems = problems;
            self
        }
    }
}
