//! Logging: through the TensorRT logger when the process gave us one (`initEdgellmPlugins`,
//! `setLoggerFinder`; the C++ side knows the TensorRT 10/11 layouts), else to stderr, filtered by
//! `EDGELLM_ALLREDUCE_LOG_LEVEL` (error, warning, info, verbose; default warning), which
//! `crate::config` sets here when it is first read ([`set_stderr_level`]: this leaf reads no
//! configuration).
//! Errors, warnings and info lines that repeat are counted, not repeated: a runtime that retries
//! a failing call in a loop, or registers and unregisters in one, gets a kind's first nine
//! lines, then one with the count at the 10th, 100th, ... The state is bounded whatever is
//! logged: a kind is remembered by a 64-bit hash of its text, at most [`KINDS`] of them, and a
//! line longer than [`MAX_LINE`] bytes (a 1 MiB field name quoted in an error) is cut, with
//! its length said.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

/// TensorRT's `ILogger::Severity` values; the stderr threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub(crate) enum Severity {
    Error = 1,
    Warning = 2,
    Info = 3,
    Verbose = 4,
}

/// The most verbose severity written to stderr.
static STDERR_LEVEL: AtomicI32 = AtomicI32::new(Severity::Warning as i32);

/// Sets the stderr threshold (`EDGELLM_ALLREDUCE_LOG_LEVEL`).
pub(crate) fn set_stderr_level(level: Severity) {
    STDERR_LEVEL.store(level as i32, Ordering::Relaxed);
}

/// Where lines go before stderr: the TensorRT logger, installed by the bridge when the library
/// is loaded (`crate::api::bridge`); it returns false when the process gave no logger. A sink
/// keeps this leaf from calling up into the bridge.
pub(crate) type Sink = fn(Severity, &str) -> bool;

static SINK: std::sync::OnceLock<Sink> = std::sync::OnceLock::new();

/// Installs the sink (once; later calls change nothing).
pub(crate) fn install_sink(sink: Sink) {
    let _ = SINK.set(sink);
}

/// The longest line logged, in bytes; longer ones are cut at a character boundary.
pub(crate) const MAX_LINE: usize = 2048;

pub(crate) fn log(severity: Severity, message: &str) {
    let message = truncated(message);
    let Some(message) = (if severity <= Severity::Info { counted(&message) } else { Some(message) }) else { return };
    let line = format!("[edgellm-allreduce] {message}");
    let delivered = SINK.get().is_some_and(|sink| sink(severity, &line));
    if !delivered && severity as i32 <= STDERR_LEVEL.load(Ordering::Relaxed) {
        // Not eprintln!: it panics when stderr is closed, and logging must never panic.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// `message`, cut to [`MAX_LINE`] bytes with its length said when it is longer.
fn truncated(message: &str) -> String {
    if message.len() <= MAX_LINE {
        return message.to_owned();
    }
    let mut end = MAX_LINE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [cut: the line is {} bytes]", &message[..end], message.len())
}

/// Kinds of message remembered (then forgotten all at once): with 8-byte keys, the memory
/// stays a few tens of KiB.
const KINDS: usize = 1024;

/// What a repeated message becomes: itself the first nine times, itself with its count at the
/// 10th, 100th, ... time, nothing otherwise. One table for the process.
fn counted(message: &str) -> Option<String> {
    static SEEN: Mutex<Option<Repeats>> = Mutex::new(None);
    let mut guard = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    guard.get_or_insert_with(Repeats::default).count(message)
}

/// How often each kind of message was seen, by [`kind_key`]: at most [`KINDS`] kinds.
#[derive(Default)]
struct Repeats {
    seen: HashMap<u64, u64>,
}

impl Repeats {
    fn count(&mut self, message: &str) -> Option<String> {
        if self.seen.len() >= KINDS {
            self.seen.clear();
        }
        let count = self.seen.entry(kind_key(message)).or_insert(0);
        *count += 1;
        match *count {
            1..=9 => Some(message.to_owned()),
            n if is_power_of_ten(n) => Some(format!("{message} [{n} times so far: repeats are counted, not logged]")),
            _ => None,
        }
    }
}

fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

/// The key of a message's kind: a hash of [`kind`] (fixed keys: the same kind, the same key).
fn kind_key(message: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    kind(message).hash(&mut hasher);
    hasher.finish()
}

/// A message's kind: the message with every word that holds a digit (a count, an address, a
/// device) replaced by '#'.
fn kind(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(if word.chars().any(|c| c.is_ascii_digit()) { "#" } else { word });
        word.clear();
    };
    for c in message.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

pub(crate) fn error(message: &str) {
    log(Severity::Error, message)
}
pub(crate) fn warning(message: &str) {
    log(Severity::Warning, message)
}
pub(crate) fn info(message: &str) {
    log(Severity::Info, message)
}
pub(crate) fn verbose(message: &str) {
    log(Severity::Verbose, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_kind_ignores_its_numbers() {
        assert_eq!(
            kind("null tensor address (inputs [0], outputs [a0])"),
            "null tensor address (inputs [#], outputs [#])"
        );
        assert_eq!(kind("device 3 (sm_90): CUDA_ERROR_OUT_OF_MEMORY"), "device # (sm_#): CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(kind("0x7f00dead"), "#");
        assert_ne!(kind("unknown plugin field 'a'"), kind("unknown plugin field 'b'"), "words without digits are kept");
    }

    #[test]
    fn a_churn_of_one_error_gives_nine_lines_then_one_per_power_of_ten() {
        let mut repeats = Repeats::default();
        let lines: Vec<String> =
            (0..120_000u64).filter_map(|i| repeats.count(&format!("log test: enqueue failed at {i:#x}"))).collect();
        assert_eq!(lines.len(), 9 + 5, "1 to 9, then 10, 100, ... 100,000: {lines:?}");
        assert_eq!(lines[0], "log test: enqueue failed at 0x0");
        assert_eq!(lines[8], "log test: enqueue failed at 0x8");
        assert!(lines[9].ends_with("[10 times so far: repeats are counted, not logged]"), "{}", lines[9]);
        assert!(lines[13].ends_with("[100000 times so far: repeats are counted, not logged]"), "{}", lines[13]);
        assert!(repeats.count("log test: another error").is_some(), "another kind is logged");
    }

    #[test]
    fn long_lines_are_cut_with_their_length_and_keys_stay_small() {
        let huge = format!("unknown plugin field '{}'", "x".repeat(1 << 20));
        let line = truncated(&huge);
        assert!(
            line.len() < MAX_LINE + 64 && line.ends_with(&format!("[cut: the line is {} bytes]", huge.len())),
            "{}",
            &line[line.len() - 60..]
        );
        let multibyte = "é".repeat(MAX_LINE);
        assert!(truncated(&multibyte).starts_with("éé"), "cut at a character boundary");
        assert_eq!(truncated("short"), "short");
        // 2,000 distinct 256 KiB kinds: the table keeps at most KINDS 8-byte keys.
        let mut repeats = Repeats::default();
        let long = "y".repeat(256 << 10);
        for i in 0..2000u32 {
            assert!(repeats.count(&format!("field '{long}{}'", char::from_u32(0x4e00 + i).unwrap())).is_some());
            assert!(repeats.seen.len() <= KINDS);
        }
    }

    #[test]
    fn an_info_churn_is_counted_too() {
        let mut repeats = Repeats::default();
        let lines = (0..1000).filter(|_| repeats.count("device 0: communicator 0x1 replaces 0x2").is_some()).count();
        assert_eq!(lines, 9 + 3, "1 to 9, then 10, 100, 1000");
    }

    #[test]
    fn powers_of_ten() {
        assert!([1, 10, 100, 1_000_000].iter().all(|&n| is_power_of_ten(n)));
        assert!([0, 2, 11, 20, 110, 999].iter().all(|&n| !is_power_of_ten(n)));
    }
}
