//! Logging: through the TensorRT logger when the process gave us one (`initEdgellmPlugins`,
//! `setLoggerFinder`; the C++ side knows the TensorRT 10/11 layouts), else to stderr, filtered by
//! `EDGELLM_ALLREDUCE_LOG_LEVEL` (error, warning, info, verbose; default warning; `crate::config`).
//! Errors and warnings that repeat are counted, not repeated: a runtime that retries a failing
//! call in a loop gets its first nine lines, then one with the count at the 10th, 100th, ...

pub use crate::config::Severity;
use std::collections::HashMap;
use std::sync::Mutex;

pub fn log(severity: Severity, message: &str) {
    let Some(message) = (if severity <= Severity::Warning { counted(message) } else { Some(message.to_owned()) }) else { return };
    let line = format!("[edgellm-allreduce] {message}");
    if !crate::ffi::trt_log(severity as i32, &line) && severity <= crate::config::get().log_level {
        // Not eprintln!: it panics when stderr is closed, and logging must never panic.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Kinds of message remembered (then forgotten all at once): the memory stays bounded.
const KINDS: usize = 1024;

/// What a repeated message becomes: itself the first nine times, itself with its count at the
/// 10th, 100th, ... time, nothing otherwise.
fn counted(message: &str) -> Option<String> {
    static SEEN: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
    let mut guard = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = guard.get_or_insert_with(HashMap::new);
    if seen.len() >= KINDS {
        seen.clear();
    }
    let count = seen.entry(kind(message)).or_insert(0);
    *count += 1;
    match *count {
        1..=9 => Some(message.to_owned()),
        n if is_power_of_ten(n) => Some(format!("{message} [{n} times so far: repeats are counted, not logged]")),
        _ => None,
    }
}

fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
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

pub fn error(message: &str) {
    log(Severity::Error, message)
}
pub fn warning(message: &str) {
    log(Severity::Warning, message)
}
pub fn info(message: &str) {
    log(Severity::Info, message)
}
pub fn verbose(message: &str) {
    log(Severity::Verbose, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_kind_ignores_its_numbers() {
        assert_eq!(kind("null tensor address (inputs [0], outputs [a0])"), "null tensor address (inputs [#], outputs [#])");
        assert_eq!(kind("device 3 (sm_90): CUDA_ERROR_OUT_OF_MEMORY"), "device # (sm_#): CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(kind("0x7f00dead"), "#");
        assert_ne!(kind("unknown plugin field 'a'"), kind("unknown plugin field 'b'"), "words without digits are kept");
    }

    #[test]
    fn a_churn_of_one_error_gives_nine_lines_then_one_per_power_of_ten() {
        let lines: Vec<String> = (0..120_000u64).filter_map(|i| counted(&format!("log test: enqueue failed at {i:#x}"))).collect();
        assert_eq!(lines.len(), 9 + 5, "1 to 9, then 10, 100, ... 100,000: {lines:?}");
        assert_eq!(lines[0], "log test: enqueue failed at 0x0");
        assert_eq!(lines[8], "log test: enqueue failed at 0x8");
        assert!(lines[9].ends_with("[10 times so far: repeats are counted, not logged]"), "{}", lines[9]);
        assert!(lines[13].ends_with("[100000 times so far: repeats are counted, not logged]"), "{}", lines[13]);
        assert!(counted("log test: another error").is_some(), "another kind is logged");
    }

    #[test]
    fn powers_of_ten() {
        assert!([1, 10, 100, 1_000_000].iter().all(|&n| is_power_of_ten(n)));
        assert!([0, 2, 11, 20, 110, 999].iter().all(|&n| !is_power_of_ten(n)));
    }
}
