//! One body type that can be sent again: it streams while it records.
//!
//! A retry or a hedge must send the same bytes as the first attempt, but an HTTP body is a
//! stream that can be read once. Reading the whole body before the first attempt (what
//! tower's and many retry layers do) delays the first byte of every upload by its transfer
//! time. [`ReplayBody`] instead hands the first attempt the bytes as they arrive and keeps
//! each chunk (a reference-counted [`Bytes`], no copy) as it passes; a later attempt — a
//! retry, or a hedge started while the first is still sending — replays what was recorded
//! and then continues from the source where the others left off.
//!
//! Recording stops at a limit: once a body has passed it, the chunks already read are kept
//! only for the reader that is still sending them, no new copy can be made
//! ([`ReplayBody::try_clone`] answers `None`), and the request is not retried — buffering it
//! would cost memory per request in flight exactly when the downstream is slow.
//!
//! The same type reads a response up to a limit ([`ReplayBody::fill`]) when its end matters
//! before it is handed on: a gRPC status in the trailers, a response an idempotency store
//! must keep. A body with nothing to record is passed through untouched
//! ([`ReplayBody::passthrough`]), and an empty body costs nothing at all.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;

use crate::wire::BoxError;

pin_project! {
    /// A body that records what it streams, so that copies of it can replay it; see the
    /// [module docs](self).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use stormguard_tower::body::ReplayBody;
    ///
    /// let first = ReplayBody::new(Full::new(Bytes::from_static(b"pay 10 EUR")), 64 * 1024);
    /// let retry = first.try_clone().expect("within the limit");
    /// assert_eq!(first.collect().await?.to_bytes(), "pay 10 EUR");
    /// assert_eq!(retry.collect().await?.to_bytes(), "pay 10 EUR");
    /// # Ok(()) }
    /// ```
    pub struct ReplayBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Empty,
        Full { data: Option<Bytes> },
        Direct { #[pin] body: SyncWrapper<B> },
        Shared { reader: Reader<B> },
    }
}

/// One copy's view of a recorded body.
struct Reader<B> {
    shared: Arc<Mutex<State<B>>>,
    id: u64,
    cursor: usize,
    trailers_sent: bool,
}

struct State<B> {
    source: Option<Pin<Box<B>>>,
    chunks: Chunks,
    recorded: usize,
    limit: usize,
    trailers: Option<HeaderMap>,
    ended: bool,
    /// The copy that read past the limit, and is the only one that may go on reading.
    over_limit_by: Option<u64>,
    failed: Option<String>,
    next_id: u64,
    waiters: Vec<Waker>,
}

/// The body failed, or a copy could not be continued: what another copy saw, or a copy that
/// fell behind a body over the replay limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(String);

impl<B> ReplayBody<B> {
    /// An empty body: nothing to record, free to copy.
    pub fn empty() -> Self {
        ReplayBody { kind: Kind::Empty }
    }

    /// A body of `data`, replayable at no cost (a fallback's answer, a cached response).
    pub fn from_bytes(data: Bytes) -> Self {
        if data.is_empty() {
            return ReplayBody::empty();
        }
        ReplayBody {
            kind: Kind::Full { data: Some(data) },
        }
    }

    /// `body` as it is, not recorded and not copyable (a response that nobody needs to read
    /// twice).
    pub fn passthrough(body: B) -> Self {
        ReplayBody {
            kind: Kind::Direct {
                body: SyncWrapper::new(body),
            },
        }
    }

    /// Records `body` as it streams, up to `limit` bytes; an empty body (by
    /// [`Body::is_end_stream`]) costs nothing.
    pub fn new(body: B, limit: usize) -> Self
    where
        B: Body,
    {
        if body.is_end_stream() {
            return ReplayBody::empty();
        }
        let state = State {
            source: Some(Box::pin(body)),
            chunks: Chunks::default(),
            recorded: 0,
            limit,
            trailers: None,
            ended: false,
            over_limit_by: None,
            failed: None,
            next_id: 1,
            waiters: Vec::new(),
        };
        ReplayBody {
            kind: Kind::Shared {
                reader: Reader {
                    shared: Arc::new(Mutex::new(state)),
                    id: 0,
                    cursor: 0,
                    trailers_sent: false,
                },
            },
        }
    }

    /// Another copy that replays the body from its start, or `None` when that is no longer
    /// possible: the body went over the replay limit, failed, or was passed through.
    pub fn try_clone(&self) -> Option<Self> {
        match &self.kind {
            Kind::Empty => Some(ReplayBody::empty()),
            Kind::Full { data } => Some(ReplayBody {
                kind: Kind::Full { data: data.clone() },
            }),
            Kind::Direct { .. } => None,
            Kind::Shared { reader } => {
                let mut state = lock(&reader.shared);
                if state.over_limit_by.is_some() || state.failed.is_some() {
                    return None;
                }
                let id = state.next_id;
                state.next_id += 1;
                Some(ReplayBody {
                    kind: Kind::Shared {
                        reader: Reader {
                            shared: Arc::clone(&reader.shared),
                            id,
                            cursor: 0,
                            trailers_sent: false,
                        },
                    },
                })
            }
        }
    }

    /// Whether [`try_clone`](Self::try_clone) would give a copy now.
    pub fn is_replayable(&self) -> bool {
        match &self.kind {
            Kind::Empty | Kind::Full { .. } => true,
            Kind::Direct { .. } => false,
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                state.over_limit_by.is_none() && state.failed.is_none()
            }
        }
    }

    /// Whether the whole body has been read and recorded (an empty body always has).
    pub fn is_complete(&self) -> bool {
        match &self.kind {
            Kind::Empty | Kind::Full { .. } => true,
            Kind::Direct { .. } => false,
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                state.ended && state.over_limit_by.is_none()
            }
        }
    }

    /// The trailers, once the whole body has been recorded.
    pub fn recorded_trailers(&self) -> Option<HeaderMap> {
        match &self.kind {
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                state.ended.then(|| state.trailers.clone()).flatten()
            }
            Kind::Empty | Kind::Full { .. } | Kind::Direct { .. } => None,
        }
    }

    /// The recorded data in one piece, once the whole body has been recorded (empty for an
    /// empty body; `None` while incomplete or over the limit).
    pub fn recorded_bytes(&self) -> Option<Bytes> {
        match &self.kind {
            Kind::Empty => Some(Bytes::new()),
            Kind::Full { data } => data.clone(),
            Kind::Direct { .. } => None,
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                if !state.ended || state.over_limit_by.is_some() {
                    return None;
                }
                Some(state.chunks.concat(state.recorded))
            }
        }
    }
}

impl<B> ReplayBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// Reads the source ahead, recording, until it ends or passes the limit, without
    /// consuming anything of this copy: it still yields the whole body afterwards. `Ok(true)`
    /// when the whole body is recorded (see [`recorded_bytes`](Self::recorded_bytes) and
    /// [`recorded_trailers`](Self::recorded_trailers)), `Ok(false)` when it went over the
    /// limit (this copy then streams the rest as it comes).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use stormguard_tower::body::ReplayBody;
    ///
    /// let mut small = ReplayBody::new(Full::new(Bytes::from_static(b"ok")), 16);
    /// assert!(small.fill().await?);
    /// assert_eq!(small.recorded_bytes().unwrap(), "ok");
    /// let mut large = ReplayBody::new(Full::new(Bytes::from(vec![7u8; 100])), 16);
    /// assert!(!large.fill().await?);
    /// assert_eq!(large.collect().await?.to_bytes().len(), 100);
    /// # Ok(()) }
    /// ```
    pub async fn fill(&mut self) -> Result<bool, BoxError> {
        let reader = match &mut self.kind {
            Kind::Empty | Kind::Full { .. } => return Ok(true),
            Kind::Direct { .. } => return Ok(false),
            Kind::Shared { reader } => reader,
        };
        std::future::poll_fn(|cx| {
            let mut state = lock(&reader.shared);
            loop {
                if let Some(failed) = &state.failed {
                    return Poll::Ready(Err(ReplayError(failed.clone()).into()));
                }
                if state.ended {
                    return Poll::Ready(Ok(true));
                }
                if state.over_limit_by.is_some() {
                    return Poll::Ready(Ok(false));
                }
                match state.pull(cx, reader.id) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(_)) => {}
                }
            }
        })
        .await
    }
}

impl<B> State<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// Reads one frame from the source into the record. `Ready(Ok(true))` when a data frame
    /// was recorded (or read past the limit by `id`), `Ready(Ok(false))` at the end.
    fn pull(&mut self, cx: &mut Context<'_>, id: u64) -> Poll<Result<bool, BoxError>> {
        let Some(source) = self.source.as_mut() else {
            self.ended = true;
            return Poll::Ready(Ok(false));
        };
        let polled = source.as_mut().poll_frame(cx);
        let frame = match polled {
            Poll::Pending => {
                if !self.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    self.waiters.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Poll::Ready(frame) => frame,
        };
        for waiter in self.waiters.drain(..) {
            waiter.wake();
        }
        match frame {
            None => {
                self.source = None;
                self.ended = true;
                Poll::Ready(Ok(false))
            }
            Some(Err(e)) => {
                let error: BoxError = e.into();
                self.failed = Some(error.to_string());
                self.source = None;
                Poll::Ready(Err(error))
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let chunk = data.copy_to_bytes(data.remaining());
                    self.recorded = self.recorded.saturating_add(chunk.len());
                    if self.recorded > self.limit && self.over_limit_by.is_none() {
                        self.over_limit_by = Some(id);
                    }
                    self.chunks.push(chunk);
                    Poll::Ready(Ok(true))
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        match &mut self.trailers {
                            Some(t) => t.extend(trailers),
                            None => self.trailers = Some(trailers),
                        }
                    }
                    Poll::Ready(Ok(true))
                }
            },
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Empty => Poll::Ready(None),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Direct { body } => body.get_pin_mut().poll_frame(cx).map(|frame| {
                frame.map(|f| {
                    f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(Into::into)
                })
            }),
            KindProj::Shared { reader } => reader.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full { data } => data.is_none(),
            // Not knowable without `&mut`: the body says so when polled.
            Kind::Direct { .. } => false,
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                state.ended
                    && reader.cursor >= state.chunks.len()
                    && (reader.trailers_sent || state.trailers.is_none())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Direct { .. } => SizeHint::default(),
            Kind::Shared { reader } => {
                let state = lock(&reader.shared);
                let ahead: u64 = state
                    .chunks
                    .iter_from(reader.cursor)
                    .map(|c| c.len() as u64)
                    .sum();
                match &state.source {
                    None => SizeHint::with_exact(ahead),
                    Some(source) => {
                        let rest = source.size_hint();
                        let mut hint = SizeHint::new();
                        hint.set_lower(rest.lower().saturating_add(ahead));
                        if let Some(upper) = rest.upper() {
                            hint.set_upper(upper.saturating_add(ahead));
                        }
                        hint
                    }
                }
            }
        }
    }
}

impl<B> Reader<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut state = lock(&self.shared);
        loop {
            if state.over_limit_by.is_some_and(|owner| owner != self.id) {
                // The owner drops what it has sent: nothing this copy could replay is safe.
                return Poll::Ready(Some(Err(ReplayError(
                    "the request body went over the replay limit while another copy was sending it"
                        .to_owned(),
                )
                .into())));
            }
            if let Some(chunk) = state.chunks.get(self.cursor) {
                self.cursor += 1;
                return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
            }
            if let Some(failed) = &state.failed {
                return Poll::Ready(Some(Err(ReplayError(failed.clone()).into())));
            }
            if state.ended {
                if !self.trailers_sent {
                    self.trailers_sent = true;
                    if let Some(trailers) = &state.trailers {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
                    }
                }
                return Poll::Ready(None);
            }
            match state.pull(cx, self.id) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Ok(_)) => {}
            }
            if state.over_limit_by == Some(self.id) {
                // Past the limit nothing more is kept for other copies: drop what this copy
                // has already sent.
                let sent = self.cursor.min(state.chunks.len());
                state.chunks.drop_front(sent);
                self.cursor -= sent;
            }
        }
    }
}

impl<B> Drop for Reader<B> {
    fn drop(&mut self) {
        // Another copy may be waiting on a frame this one was to pull: let it pull instead.
        if let Ok(mut state) = self.shared.lock() {
            for waiter in state.waiters.drain(..) {
                waiter.wake();
            }
        }
    }
}

impl<B> std::fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Empty => "empty",
            Kind::Full { .. } => "bytes",
            Kind::Direct { .. } => "passthrough",
            Kind::Shared { .. } => "recorded",
        };
        f.debug_struct("ReplayBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

fn lock<B>(shared: &Mutex<State<B>>) -> MutexGuard<'_, State<B>> {
    // A panic while holding the lock leaves consistent data (every update is one push or
    // one flag): keep going with it.
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The recorded chunks. A body of one chunk (the usual request) is kept without a list.
#[derive(Default)]
struct Chunks {
    first: Option<Bytes>,
    more: Vec<Bytes>,
}

impl Chunks {
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }

    fn get(&self, index: usize) -> Option<&Bytes> {
        match (&self.first, index) {
            (Some(first), 0) => Some(first),
            (Some(_), i) => self.more.get(i - 1),
            (None, i) => self.more.get(i),
        }
    }

    fn push(&mut self, chunk: Bytes) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(chunk);
        } else {
            self.more.push(chunk);
        }
    }

    /// Forgets the first `n` chunks (read past by the only copy that may go on).
    fn drop_front(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let from_more = if self.first.take().is_some() {
            n - 1
        } else {
            n
        };
        self.more.drain(..from_more.min(self.more.len()));
    }

    fn iter_from(&self, index: usize) -> impl Iterator<Item = &Bytes> {
        self.first.iter().chain(self.more.iter()).skip(index)
    }

    fn concat(&self, total: usize) -> Bytes {
        match (&self.first, self.more.as_slice()) {
            (None, []) => Bytes::new(),
            (Some(one), []) => one.clone(),
            _ => {
                let mut all = Vec::with_capacity(total);
                for chunk in self.iter_from(0) {
                    all.extend_from_slice(chunk);
                }
                Bytes::from(all)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::convert::Infallible;

    fn chunks(
        parts: &[&'static str],
        trailers: bool,
    ) -> impl Body<Data = Bytes, Error = Infallible> + use<> {
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        if trailers {
            let mut t = HeaderMap::new();
            t.insert("grpc-status", "14".parse().expect("value"));
            frames.push(Ok(Frame::trailers(t)));
        }
        StreamBody::new(futures::stream::iter(frames))
    }

    async fn collect<B>(body: ReplayBody<B>) -> (Bytes, Option<HeaderMap>)
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (collected.to_bytes(), trailers)
    }

    #[tokio::test]
    async fn every_copy_gets_the_same_bytes_and_trailers() {
        let first = ReplayBody::new(chunks(&["a", "bc", "def"], true), 1024);
        let second = first.try_clone().expect("copy");
        let (bytes, trailers) = collect(first).await;
        assert_eq!(bytes, "abcdef");
        assert_eq!(trailers.expect("trailers")["grpc-status"], "14");
        let third_made_late = second.try_clone().expect("copy after the end");
        let (bytes, trailers) = collect(second).await;
        assert_eq!(bytes, "abcdef");
        assert!(trailers.is_some());
        assert_eq!(collect(third_made_late).await.0, "abcdef");
    }

    #[tokio::test]
    async fn a_copy_made_mid_stream_replays_then_continues() {
        let mut first = ReplayBody::new(chunks(&["a", "b", "c"], false), 1024);
        let frame = first.frame().await.expect("frame").expect("ok");
        assert_eq!(frame.into_data().expect("data"), "a");
        let second = first.try_clone().expect("copy");
        // The second copy reads everything, pulling the rest from the source itself...
        assert_eq!(collect(second).await.0, "abc");
        // ...and the first continues where it was.
        assert_eq!(collect(first).await.0, "bc");
    }

    #[tokio::test]
    async fn over_the_limit_the_first_copy_streams_on_and_no_copy_is_made() {
        let first = ReplayBody::new(chunks(&["12345", "67890", "abc"], false), 6);
        assert!(first.is_replayable());
        let lagging = first.try_clone().expect("copy before the limit");
        let (bytes, _) = collect(first).await;
        assert_eq!(bytes, "1234567890abc");
        let mut lagging = lagging;
        // The lagging copy fails instead of inventing bytes.
        let error = match lagging.frame().await {
            Some(Err(e)) => e,
            other => panic!("a lagging copy must fail, got {other:?}"),
        };
        assert!(error.to_string().contains("replay limit"), "{error}");
        assert!(!lagging.is_replayable());
        assert!(lagging.try_clone().is_none());
    }

    #[tokio::test]
    async fn fill_reads_ahead_without_consuming() {
        let mut body = ReplayBody::new(chunks(&["x", "y"], true), 10);
        assert!(body.fill().await.expect("fill"));
        assert!(body.is_complete());
        assert_eq!(body.recorded_bytes().expect("complete"), "xy");
        assert!(body.recorded_trailers().is_some());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(collect(body).await.0, "xy");
    }

    #[tokio::test]
    async fn empty_and_passthrough_bodies_cost_nothing() {
        let empty = ReplayBody::new(Full::new(Bytes::new()), 10);
        assert!(empty.is_end_stream());
        assert!(empty.try_clone().is_some());
        assert_eq!(empty.recorded_bytes().expect("empty"), "");
        let direct = ReplayBody::passthrough(Full::new(Bytes::from_static(b"z")));
        assert!(direct.try_clone().is_none());
        assert_eq!(collect(direct).await.0, "z");
    }
}
