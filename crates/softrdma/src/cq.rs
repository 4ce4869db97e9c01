//! Completion queues: poll, block, or await.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{CqHandle, WcStatus, WorkCompletion};

use crate::device::Device;
use crate::provider::ProviderCq;
use crate::{Error, Result};

/// A completion queue (`ibv_cq`). Cheap to clone; destroyed when the last clone and every QP
/// using it are gone.
#[derive(Clone, Debug)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) dev: Device,
    /// The provider's CQ: shared with an `async` waiter, which keeps its descriptor.
    cq: Arc<dyn ProviderCq>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // QPs hold their CQs, so nothing uses this one any more.
        if let Err(e) = self.dev.provider().destroy_cq(self.cq.handle()) {
            tracing::warn!(error = %e, "destroy_cq failed");
        }
    }
}

impl Cq {
    pub(crate) fn new(dev: Device, cq: Box<dyn ProviderCq>) -> Cq {
        Cq {
            inner: Arc::new(CqInner {
                dev,
                cq: Arc::from(cq),
            }),
        }
    }

    /// Its handle (what QPs name it by).
    pub(crate) fn handle(&self) -> CqHandle {
        self.inner.cq.handle()
    }

    /// Take up to `max` completions, oldest first (`ibv_poll_cq`); never blocks (on the
    /// daemon backend it reads the CQ's ring in shared memory, with no system call).
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        self.inner.dev.provider().poll_cq(&*self.inner.cq, max)
    }

    /// Take completions into `out`, oldest first, as many as wait and fit; returns how many.
    /// The allocation-free form of [`Cq::poll`], for polling loops.
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        self.inner.dev.provider().poll_cq_into(&*self.inner.cq, out)
    }

    /// Take the oldest completion, if any.
    pub fn poll_one(&self) -> Result<Option<WorkCompletion>> {
        Ok(self.poll(1)?.pop())
    }

    /// Give the CQ room for `cqe` completions (`ibv_resize_cq`); returns the size it has
    /// now. Refused (EINVAL) while more completions than that wait in it.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        self.inner.cq.resize(cqe)
    }

    /// Completions waiting.
    pub fn len(&self) -> Result<usize> {
        self.inner.cq.len()
    }

    /// No completions waiting.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Block until at least one completion is there, then take up to `max`; at most `timeout`
    /// (`None`: no limit), else [`Error::Timeout`]. Polls briefly, then sleeps on the CQ's
    /// notifier: no busy spin.
    pub fn wait(&self, max: usize, timeout: Option<Duration>) -> Result<Vec<WorkCompletion>> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let spin = self.inner.dev.inner.wait_spin;
        loop {
            let v = self.poll(max)?;
            if !v.is_empty() {
                return Ok(v);
            }
            if start.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            let left = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(Error::Timeout);
                    }
                    Some(d - now)
                }
                None => None,
            };
            // Sleeps until the CQ has a completion (embedded: receiving packets on this
            // thread meanwhile; daemon: on the CQ's completion channel).
            self.inner.cq.wait(left)?;
        }
    }

    /// Block for one completion (see [`Cq::wait`]).
    pub fn wait_one(&self, timeout: Option<Duration>) -> Result<WorkCompletion> {
        let mut v = self.wait(1, timeout)?;
        v.pop().ok_or(Error::Timeout)
    }

    /// Block for one completion and turn an error status into [`Error::Completion`].
    pub fn wait_ok(&self, timeout: Option<Duration>) -> Result<WorkCompletion> {
        let wc = self.wait_one(timeout)?;
        check(wc)
    }

    /// Request a notification for the next completion (`ibv_req_notify_cq`): the descriptor
    /// of [`AsFd`] becomes readable. For callers with their own event loop.
    pub fn req_notify(&self) -> Result<()> {
        self.inner.cq.arm(false)
    }

    /// Request a notification for the next solicited or error completion only
    /// (`ibv_req_notify_cq` with `solicited_only`).
    pub fn req_notify_solicited(&self) -> Result<()> {
        self.inner.cq.arm(true)
    }

    /// Consume a notification (`ibv_get_cq_event` + ack); true if there was one.
    pub fn clear_notification(&self) -> bool {
        self.inner.cq.clear_event()
    }

    /// Wait asynchronously until at least one completion is there, then take up to `max`.
    #[cfg(feature = "tokio")]
    pub async fn wait_async(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        let fd = NotifierFd(self.inner.cq.clone());
        // SAFETY: `NotifierFd` holds the CQ (and so its eventfd) alive for as long as the
        // AsyncFd lives, and always reports that same descriptor.
        #[allow(unsafe_code)]
        let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| Error::Io(std::io::Error::from(e)))?;
        loop {
            let v = self.poll(max)?;
            if !v.is_empty() {
                return Ok(v);
            }
            self.req_notify()?;
            let v = self.poll(max)?;
            if !v.is_empty() {
                self.clear_notification();
                return Ok(v);
            }
            let mut guard = afd.readable().await?;
            self.clear_notification();
            guard.clear_ready();
        }
    }

    /// Wait asynchronously for one completion; an error status becomes [`Error::Completion`].
    #[cfg(feature = "tokio")]
    pub async fn wait_ok_async(&self) -> Result<WorkCompletion> {
        let mut v = self.wait_async(1).await?;
        check(v.pop().ok_or(Error::Timeout)?)
    }
}

/// Turn an error status into [`Error::Completion`].
pub(crate) fn check(wc: WorkCompletion) -> Result<WorkCompletion> {
    if wc.status == WcStatus::Success {
        Ok(wc)
    } else {
        Err(Error::Completion {
            wr_id: wc.wr_id,
            status: wc.status,
        })
    }
}

impl AsFd for Cq {
    /// The notification descriptor: readable after [`Cq::req_notify`] once a completion is
    /// there.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.cq.event_fd()
    }
}

#[cfg(feature = "tokio")]
struct NotifierFd(Arc<dyn ProviderCq>);

#[cfg(feature = "tokio")]
impl std::os::fd::AsRawFd for NotifierFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.event_fd().as_raw_fd()
    }
}
