//! Faults of the custom kernels as the host sees them, without synchronizing: one 64-bit word
//! per device in mapped pinned memory (in the device's record, `super::device::fault_word`,
//! allocated at its first group and kept for the life of the process), which a kernel writes,
//! as `generation << 8 | EAR_FAULT_*`, when it gives up waiting for a peer or finds its group
//! aborted or released (`kernels/wait.cuh`). Enqueue and `edgellmAllReduceLastError` read it
//! with a plain load.

use crate::contract::{EAR_FAULT_ABORTED, EAR_FAULT_RELEASED, EAR_FAULT_TIMEOUT};
use crate::cuda::{self, DevicePtr};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// A device's fault word: 8 bytes of mapped host memory (portable: every context maps it, and
/// with unified addressing its host address is its device address), allocated once and never
/// freed (a kernel may still write it). Read and cleared with plain atomic operations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultWord(&'static AtomicU64);

impl FaultWord {
    /// A zeroed word, in the current context.
    pub(crate) fn allocate() -> Result<FaultWord> {
        let host = cuda::MappedHost::zeroed(std::mem::size_of::<AtomicU64>())?.leak();
        // SAFETY: a leaked (never freed), zero-filled, page-aligned allocation of 8 bytes.
        Ok(FaultWord(unsafe { &*(host as *const AtomicU64) }))
    }

    /// Its device address, for the kernels' parameters.
    pub(crate) fn ptr(self) -> DevicePtr {
        DevicePtr(self.0 as *const AtomicU64 as u64)
    }

    /// What it holds (None: no fault).
    pub(crate) fn read(self) -> Option<Record> {
        Record::decode(self.0.load(Ordering::Acquire))
    }

    /// Clears it (a new group forms on its device).
    pub(crate) fn clear(self) {
        self.0.store(0, Ordering::Release);
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
    fn a_word_is_read_and_cleared_with_plain_memory_operations() {
        let word = FaultWord(Box::leak(Box::new(AtomicU64::new(0))));
        assert_eq!(word.read(), None);
        let r = Record { generation: 7, fault: Fault::TimedOut };
        word.0.store(r.encode(), Ordering::Release);
        assert_eq!(word.read(), Some(r));
        word.clear();
        assert_eq!(word.read(), None);
    }
}
