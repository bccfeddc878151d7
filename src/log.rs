//! Logging: through the TensorRT logger when the process gave us one (`initEdgellmPlugins`,
//! `setLoggerFinder`; the C++ side knows the TensorRT 10/11 layouts), else to stderr, filtered by
//! `EDGELLM_ALLREDUCE_LOG_LEVEL` (error, warning, info, verbose; default warning; `crate::config`).

pub use crate::config::Severity;

pub fn log(severity: Severity, message: &str) {
    let line = format!("[edgellm-allreduce] {message}");
    if !crate::ffi::trt_log(severity as i32, &line) && severity <= crate::config::get().log_level {
        // Not eprintln!: it panics when stderr is closed, and logging must never panic.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{line}");
    }
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
