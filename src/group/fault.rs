//! Faults of the custom kernels as the host sees them, without synchronizing: one 64-bit word
//! per device in mapped pinned memory (one page, allocated at the first group's setup and kept
//! for the life of the process), which a kernel writes, as `generation << 8 | EAR_FAULT_*`,
//! when it gives up waiting for a peer or finds its group aborted or released
//! (`kernels/wait.cuh`). Enqueue and `edgellmAllReduceLastError` read it with a plain load.

use crate::contract::{EAR_FAULT_ABORTED, EAR_FAULT_RELEASED, EAR_FAULT_TIMEOUT};
use crate::cuda::{self, DevicePtr};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Devices with a fault word (ordinals 0..MAX_DEVICES): one 4 KiB page.
pub(crate) const MAX_DEVICES: usize = 512;

/// Why a custom all-reduce failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A kernel waited for a peer longer than the bound and stopped: its output is wrong.
    TimedOut,
    /// A kernel found its group aborted (a peer gave up first) and did nothing or stopped.
    Aborted,
    /// A kernel of a released group ran (a CUDA graph captured before the release was
    /// replayed) and did nothing.
    Released,
}

impl Fault {
    pub fn code(self) -> u32 {
        match self {
            Fault::TimedOut => EAR_FAULT_TIMEOUT,
            Fault::Aborted => EAR_FAULT_ABORTED,
            Fault::Released => EAR_FAULT_RELEASED,
        }
    }

    pub fn from_code(code: u32) -> Option<Fault> {
        [Fault::TimedOut, Fault::Aborted, Fault::Released].into_iter().find(|f| f.code() == code)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Fault::TimedOut => "a kernel waited for a peer rank longer than EDGELLM_ALLREDUCE_TIMEOUT_MS and gave up (a rank did not launch its part of the call); that call's output is wrong",
            Fault::Aborted => "a kernel found its group aborted (a peer rank gave up waiting) and did not run; that call's output is wrong",
            Fault::Released => "a kernel of a released group ran (a CUDA graph captured before edgellmAllReduceReleaseWorkspaces or unregistration was replayed) and did not run; that call's output is wrong",
        }
    }
}

/// A fault word's content: which group (by generation) and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub generation: u32,
    pub fault: Fault,
}

impl Record {
    pub(crate) fn decode(word: u64) -> Option<Record> {
        let fault = Fault::from_code((word & 0xff) as u32)?;
        Some(Record { generation: (word >> 8) as u32, fault })
    }

    #[cfg(test)]
    pub(crate) fn encode(self) -> u64 {
        (self.generation as u64) << 8 | self.fault.code() as u64
    }
}

/// The page of fault words: its host address (with unified addressing, also its device address).
static PAGE: OnceLock<usize> = OnceLock::new();

fn words() -> Option<&'static [AtomicU64]> {
    let page = *PAGE.get()?;
    // SAFETY: the page holds MAX_DEVICES zero-filled, 8-byte aligned words and is never freed;
    // the kernels write them with whole 64-bit stores.
    Some(unsafe { std::slice::from_raw_parts(page as *const AtomicU64, MAX_DEVICES) })
}

/// The device address of `device`'s fault word, for the kernels' parameters. Allocates the page
/// on first use, in the current context (setup time; mapped into every context).
pub(crate) fn word(device: i32) -> Result<DevicePtr> {
    static ALLOCATING: Mutex<()> = Mutex::new(());
    let index =
        usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES).ok_or(crate::error::Error::DeviceOrdinal(device))?;
    let page = match PAGE.get() {
        Some(&page) => page,
        None => {
            let _one = ALLOCATING.lock().unwrap_or_else(|p| p.into_inner());
            match PAGE.get() {
                Some(&page) => page,
                None => {
                    let page = cuda::mapped_host_page(MAX_DEVICES * 8)?;
                    PAGE.get_or_init(|| page);
                    page
                }
            }
        }
    };
    Ok(DevicePtr((page + index * 8) as u64))
}

/// What `device`'s fault word holds (None: no fault, or no page yet). A plain load.
pub(crate) fn read(device: i32) -> Option<Record> {
    let word = words()?.get(usize::try_from(device).ok()?)?;
    Record::decode(word.load(Ordering::Acquire))
}

/// Clears `device`'s fault word (a new group forms on it).
pub(crate) fn clear(device: i32) {
    if let Some(word) = words().and_then(|w| w.get(usize::try_from(device).ok()?)) {
        word.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_to_generation_and_fault() {
        assert_eq!(Record::decode(0), None, "zero: no fault");
        assert_eq!(Record::decode(7 << 8), None, "an unknown code is no fault");
        for fault in [Fault::TimedOut, Fault::Aborted, Fault::Released] {
            let r = Record { generation: 0xfff_fffe, fault };
            assert_eq!(Record::decode(r.encode()), Some(r));
            assert_eq!(Fault::from_code(fault.code()), Some(fault));
        }
        assert_eq!([EAR_FAULT_TIMEOUT, EAR_FAULT_ABORTED, EAR_FAULT_RELEASED], [1, 2, 3], "the C API's values");
    }

    #[test]
    fn without_a_page_nothing_is_read_and_nothing_breaks() {
        // No GPU in unit tests: the page is never allocated.
        assert_eq!(read(0), None);
        assert_eq!(read(-1), None);
        clear(0);
        assert!(matches!(word(-1), Err(crate::error::Error::DeviceOrdinal(-1))));
        assert!(matches!(word(MAX_DEVICES as i32), Err(crate::error::Error::DeviceOrdinal(_))));
    }
}
