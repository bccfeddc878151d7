//! The machine a tuning file was measured on, as the file and the library describe it.

/// One GPU as the tuner saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// `domain:bus:device.function`, lower case ("0000:17:00.0"): stable across
    /// `CUDA_VISIBLE_DEVICES`, unlike the ordinal.
    pub bus_id: String,
    pub name: String,
}

/// What a tuning file must have been measured on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// The host name (in a container, the container's: give it a stable one).
    pub host: String,
    /// The kernel module's version and the CUDA version of the driver.
    pub driver: String,
    /// Every GPU this process sees, by bus id.
    pub gpus: Vec<Gpu>,
}

impl Machine {
    /// This machine as this process sees it (its GPUs: those CUDA shows it).
    pub fn current() -> Result<Machine, String> {
        let err = |e: crate::error::Error| e.to_string();
        let count = crate::cuda::device_count().map_err(err)?;
        let gpus = (0..count)
            .map(|d| {
                Ok(Gpu {
                    bus_id: one_line(&crate::cuda::pci_bus_id(d).map_err(err)?),
                    name: one_line(&crate::cuda::device_name(d).map_err(err)?),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut gpus = gpus;
        gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        let module = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
        let version = crate::cuda::driver_version().map_err(err)?;
        Ok(Machine { host: one_line(&host_name()), driver: driver_description(version, module.as_deref()), gpus })
    }
}

/// `580.82.09 (CUDA 13.0)` from `cuDriverGetVersion` and `/proc/driver/nvidia/version` (the
/// module's version; the CUDA version alone without it).
pub(super) fn driver_description(cuda_version: i32, proc_version: Option<&str>) -> String {
    let cuda = format!("CUDA {}.{}", cuda_version / 1000, cuda_version % 1000 / 10);
    let is_version =
        |t: &&str| t.contains('.') && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let module = proc_version
        .and_then(|text| text.lines().find(|l| l.starts_with("NVRM version")))
        .and_then(|line| line.split_whitespace().find(is_version));
    match module {
        Some(m) => format!("{m} ({cuda})"),
        None => cuda,
    }
}

/// The host name (empty when the system has none).
pub(super) fn host_name() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// `s` on one line: control characters become spaces, the ends trimmed.
pub(super) fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_owned()
}

/// This build: the crate's version and the kernels' protocol id ("0.1.0 EAR8").
pub fn library_id() -> String {
    let id = crate::contract::EAR_PROTOCOL_ID.to_be_bytes();
    format!("{} {}", env!("CARGO_PKG_VERSION"), String::from_utf8_lossy(&id))
}
