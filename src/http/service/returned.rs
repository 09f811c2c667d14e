//! What an origin call sends back to the request that made it: one type,
//! [`Returned`], on one bounded channel, one way (call → request). The
//! flight's outcome, which every waiter shares, comes from the engine; this
//! is what only the request that made the call may hold.

use std::sync::Arc;

use http::{Request, Response};
use tokio::sync::mpsc;

use crate::http::body::CacheBody;
use crate::http::cache_status::Detail;
use crate::http::stream::{Stream, StreamReader};

/// Every message a call sends; it sends at most two, so a channel of two
/// never fills: a [`Spare`](Returned::Spare) as it starts, then a
/// [`Handoff`](Returned::Handoff) or a [`Failed`](Returned::Failed).
/// Boxed, so the channel's slots stay small for every request that makes
/// a call, also the many that follow and never start it.
pub(super) enum Returned<S, ReqB, ResB, E> {
    /// It started as its flight's computation and is spent: a copy of its
    /// service and request, for a call of the request's own after the
    /// flight ([`OriginCall::keeping_spare`](super::origin::OriginCall::keeping_spare)).
    Spare(Box<(S, Request<ReqB>)>),
    /// Its answer, handed over before the flight's outcome: streamed past
    /// the cache to this request alone, or this request's reader of a
    /// streamed fill.
    Handoff(Box<Handoff<ResB>>),
    /// The inner service's own error, as-is, for the request to return.
    Failed(Box<E>),
}

/// What the initiating request is handed before the flight's outcome.
pub(super) enum Handoff<ResB> {
    /// Too large to store and not shared: streamed to it alone.
    TooLarge(Response<CacheBody<ResB>>),
    /// A 2xx or 3xx that will not be stored, for a request under a pass
    /// marker: streamed to it alone, unbuffered.
    Passed(Response<CacheBody<ResB>>),
    /// Its own reader of a fill streamed to every waiter, and the
    /// `Cache-Status` detail (`too-large` when it will not be stored).
    Streaming(Arc<Stream>, StreamReader, Detail),
}

/// At most one spare and one of a handoff or an error.
const MESSAGES: usize = 2;

/// The call's end of the channel.
pub(super) struct ReturnTo<S, ReqB, ResB, E>(mpsc::Sender<Returned<S, ReqB, ResB, E>>);

/// The request's end: what the call sent, kept until the request asks for
/// it, whatever order it asks in.
pub(super) struct Returns<S, ReqB, ResB, E> {
    rx: mpsc::Receiver<Returned<S, ReqB, ResB, E>>,
    spare: Option<Box<(S, Request<ReqB>)>>,
    handoff: Option<Box<Handoff<ResB>>>,
    error: Option<Box<E>>,
}

impl<S, ReqB, ResB, E> ReturnTo<S, ReqB, ResB, E> {
    /// Never blocks: the channel has room for every message a call sends.
    /// A request that went away takes nothing.
    fn send(&self, returned: Returned<S, ReqB, ResB, E>) {
        let _ = self.0.try_send(returned);
    }

    pub(super) fn spare(&self, spare: (S, Request<ReqB>)) {
        self.send(Returned::Spare(Box::new(spare)));
    }

    pub(super) fn failed(self, error: E) {
        self.send(Returned::Failed(Box::new(error)));
    }

    pub(super) fn handoff(self, handoff: Handoff<ResB>) {
        self.send(Returned::Handoff(Box::new(handoff)));
    }
}

impl<S, ReqB, ResB, E> ReturnTo<S, ReqB, ResB, E>
where
    S: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
    E: Send + 'static,
{
    /// The end that hands the answer over, for the steps that read its
    /// body and know nothing of the service.
    pub(super) fn handing(self) -> HandTo<ResB> {
        HandTo(Box::new(move |handoff| self.handoff(handoff)))
    }
}

/// Hands a call's answer to the request that made it, as its
/// [`Returned::Handoff`].
pub(super) struct HandTo<ResB>(Box<dyn FnOnce(Handoff<ResB>) + Send>);

impl<ResB> HandTo<ResB> {
    pub(super) fn send(self, handoff: Handoff<ResB>) {
        (self.0)(handoff);
    }
}

impl<S, ReqB, ResB, E> Returns<S, ReqB, ResB, E> {
    /// A call's channel back to the request that makes it: the call's
    /// end, and this one.
    pub(super) fn channel() -> (ReturnTo<S, ReqB, ResB, E>, Self) {
        let (tx, rx) = mpsc::channel(MESSAGES);
        let returns = Self {
            rx,
            spare: None,
            handoff: None,
            error: None,
        };
        (ReturnTo(tx), returns)
    }

    fn keep(&mut self, returned: Returned<S, ReqB, ResB, E>) {
        match returned {
            Returned::Spare(spare) => self.spare = Some(spare),
            Returned::Handoff(handoff) => self.handoff = Some(handoff),
            Returned::Failed(error) => self.error = Some(error),
        }
    }

    /// Keep what has come so far.
    fn drain(&mut self) {
        while let Ok(returned) = self.rx.try_recv() {
            self.keep(returned);
        }
    }

    /// The spare, if the call started and made one.
    pub(super) fn take_spare(&mut self) -> Option<(S, Request<ReqB>)> {
        self.drain();
        self.spare.take().map(|spare| *spare)
    }

    /// The inner service's error, if it returned one.
    pub(super) fn take_error(&mut self) -> Option<E> {
        self.drain();
        self.error.take().map(|error| *error)
    }

    /// The handoff, if it has come.
    pub(super) fn try_handoff(&mut self) -> Option<Handoff<ResB>> {
        self.drain();
        self.handoff.take().map(|handoff| *handoff)
    }

    /// The handoff once it comes; `None` once the call has ended without
    /// one. Cancel-safe: what arrives meanwhile is kept.
    pub(super) async fn handoff(&mut self) -> Option<Handoff<ResB>> {
        loop {
            if let Some(handoff) = self.handoff.take() {
                return Some(*handoff);
            }
            let returned = self.rx.recv().await?;
            self.keep(returned);
        }
    }
}
