//! Where the tuning file is found, and loading it once per process (one warning when refused).

use super::*;

/// Where the tuning file is looked for when `EDGELLM_ALLREDUCE_TUNING` is unset: [`FILE_NAME`]
/// in the directory of the file that holds this library.
pub(crate) fn default_path() -> Option<PathBuf> {
    let (file, _) = crate::loader::this_object()?;
    Some(file.parent()?.join(FILE_NAME))
}

/// Reads and checks the file at `path` against `machine()` (asked only when the file parses).
/// `Ok(None)`: no file where none was asked for (`explicit` false: the default place).
pub(crate) fn load(
    path: &Path,
    explicit: bool,
    machine: impl FnOnce() -> Result<Machine, String>,
) -> Result<Option<Tuning>, TuningError> {
    let io = |m: String| TuningError::new(TuningErrorKind::Io, None, m);
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(None),
        Err(e) => return Err(io(format!("cannot read it: {e}"))),
    };
    if size > MAX_FILE_BYTES {
        return Err(io(format!("{size} bytes: larger than any tuning file ({MAX_FILE_BYTES} at most)")));
    }
    let bytes = std::fs::read(path).map_err(|e| io(format!("cannot read it: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| io("not UTF-8 text".to_owned()))?;
    // Parsing is written not to panic; should it, the built-in tables still serve.
    let parsed = std::panic::catch_unwind(|| Tuning::parse(&text))
        .unwrap_or_else(|_| Err(TuningError::new(TuningErrorKind::Syntax, None, "the parser failed on it")))?;
    let current = machine().map_err(|e| {
        TuningError::new(TuningErrorKind::Foreign, None, format!("cannot tell which machine this is ({e})"))
    })?;
    parsed.check(&current)?;
    Ok(Some(parsed))
}

/// The tuning file of this process, read once (`EDGELLM_ALLREDUCE_TUNING`, else
/// [`default_path`]); None when there is none or it was refused (one warning says why).
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub fn active() -> Option<&'static Tuning> {
    static ACTIVE: OnceLock<Option<Tuning>> = OnceLock::new();
    ACTIVE
        .get_or_init(|| {
            let configured = crate::config::get().tuning_file.clone();
            let explicit = configured.is_some();
            let path = configured.or_else(default_path)?;
            match load(&path, explicit, Machine::current) {
                Ok(Some(t)) => {
                    crate::log::info(&format!(
                        "tuning file {}: AUTO uses its tables for groups over {} links (fingerprint {:016x})",
                        path.display(),
                        t.links.name(),
                        t.fingerprint()
                    ));
                    Some(t)
                }
                Ok(None) => None,
                Err(e) => {
                    crate::log::warning(&format!("tuning file {}: {e}; AUTO uses its built-in tables", path.display()));
                    None
                }
            }
        })
        .as_ref()
}

/// [`Tuning::fingerprint`] of this process's tuning file, 0 without one.
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub fn active_fingerprint() -> u64 {
    active().map_or(0, Tuning::fingerprint)
}
