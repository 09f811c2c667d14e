//! One client connection's watch: served until it ends, asked to finish at
//! shutdown, and closed when it goes quiet. One timer per connection, moved
//! once per `--header-timeout`, instead of hyper's header-read timer, which
//! is armed and disarmed for every request.
//!
//! Quiet means a whole header timeout passed in which no request head
//! arrived and no request was in flight (from its head until its response
//! body is done or dropped). A connection quiet that long before its first
//! head (silent, or a slow head) is dropped; one that has had requests is
//! asked to finish gracefully (HTTP/1.1: closed; HTTP/2: GOAWAY) and dropped
//! when still open and idle one timeout later. So an idle or slow client is
//! cut after between one and two timeouts (three for a drained HTTP/2
//! connection). Imports nothing else of the proxy.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;

/// What a connection's requests share (`T`), and how many of them have
/// started (high 32 bits, wrapping) and are in flight (low 32 bits), in one
/// atomic so a request costs one add and one subtract.
#[derive(Debug)]
pub struct Activity<T> {
    count: AtomicU64,
    shared: T,
}

const STARTED: u64 = 1 << 32;
const IN_FLIGHT: u64 = STARTED - 1;

impl<T> Activity<T> {
    pub fn new(shared: T) -> Self {
        Self {
            count: AtomicU64::new(0),
            shared,
        }
    }

    /// A request head arrived: in flight until the guard is dropped.
    pub fn start(self: &Arc<Self>) -> Busy<T> {
        self.count.fetch_add(STARTED + 1, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    fn now(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// One request in flight, with what its connection shares; dropping it
/// ends the request.
#[derive(Debug)]
pub struct Busy<T>(Arc<Activity<T>>);

impl<T> Busy<T> {
    pub fn shared(&self) -> &T {
        &self.0.shared
    }
}

impl<T> Drop for Busy<T> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in flight until it is done
    /// (hyper drops a body once it is written, or the stream is reset).
    #[derive(Debug)]
    pub struct Tracked<B, T> {
        #[pin]
        body: B,
        busy: Busy<T>,
    }
}

impl<B, T> Tracked<B, T> {
    pub fn new(body: B, busy: Busy<T>) -> Self {
        Self { body, busy }
    }
}

impl<B: Body<Data = Bytes>, T> Body for Tracked<B, T> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Whether a quiet connection is still served, asked to finish, or done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiet {
    Serving,
    Finishing,
}

/// Serve `conn` until it ends; `stop` changing (or its sender going) asks
/// it to finish (`finish`: hyper's `graceful_shutdown`); a quiet `timeout`
/// (see the module) closes it. `None` when the watch cut it off.
pub async fn watch<C: Future, T>(
    conn: C,
    finish: impl Fn(Pin<&mut C>),
    activity: &Activity<T>,
    timeout: Duration,
    mut stop: watch::Receiver<()>,
) -> Option<C::Output> {
    let mut conn = std::pin::pin!(conn);
    let quiet = tokio::time::sleep(timeout);
    let mut quiet = std::pin::pin!(quiet);
    let mut seen = activity.now();
    let mut state = Quiet::Serving;
    let mut stopping = false;
    // One future for the whole connection, not one per wake-up.
    let stopped = stop.changed();
    let mut stopped = std::pin::pin!(stopped);
    loop {
        tokio::select! {
            biased;
            out = conn.as_mut() => return Some(out),
            _ = stopped.as_mut(), if !stopping => {
                stopping = true;
                finish(conn.as_mut());
            }
            () = quiet.as_mut() => {
                let now = activity.now();
                if now & IN_FLIGHT != 0 || now != seen {
                    seen = now;
                } else if state == Quiet::Finishing || now == 0 {
                    // Nothing in flight: nothing is lost.
                    return None;
                } else {
                    state = Quiet::Finishing;
                    finish(conn.as_mut());
                }
                quiet.as_mut().reset(Instant::now() + timeout);
            }
        }
    }
}
