//! Every kernel launch of the library goes through [`Launch::run`]: a family's all-reduce, the
//! residual + RMSNorm kernel, the peer self-test, the link probe. One place decides how a kernel
//! is launched: its one parameter block by value, no dynamic shared memory, programmatic dependent
//! launch where the device's kernels allow it (`DeviceKernels::pdl`).

use crate::contract::EarPlan;
use crate::cuda::{self, Function, Stream};
use crate::error::Result;

/// A kernel ready to launch: its function, grid and block, and whether it may start early.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub function: Function,
    pub grid: u32,
    pub block: u32,
    pub pdl: bool,
}

impl Launch {
    /// `function` on the grid and block of `plan`.
    pub(crate) fn planned(function: Function, plan: &EarPlan, pdl: bool) -> Launch {
        Launch { function, grid: plan.grid, block: plan.block, pdl }
    }

    /// Enqueues the kernel on `stream` with `params` as its one argument.
    ///
    /// # Safety
    /// `params` must be the kernel's parameter block, laid out as the kernel expects, describing
    /// memory the kernel may access; `stream` a stream of the context the function was loaded in.
    pub(crate) unsafe fn run<P>(&self, params: &P, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { cuda::launch(self.function, self.grid, self.block, stream, params, self.pdl) }
    }
}
