//! Bodies that can be sent again, and responses whose trailers were read.
//!
//! A retry must send the same bytes as the first attempt, but an HTTP body is a stream that
//! can be read once. So the layer reads a request body into memory before the first attempt,
//! up to a limit, and hands every attempt a cheap copy ([`Bytes`] is reference counted). A
//! body over the limit is not held: what was read is sent, followed by the rest of the
//! stream, once — such a request is never retried (buffering it would cost memory per
//! request in flight exactly when the downstream is slow).
//!
//! A gRPC response says whether it failed in its trailers, after the body. To classify a
//! unary response the layer reads it the same way, up to a limit, and hands back the
//! buffered copy; a response over the limit is passed on unread, as committed.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

use super::BoxError;

/// A body read to its end: the data in one piece, and the trailers (boxed: they are rare,
/// and a body is moved with every attempt, so it should be small).
#[derive(Clone, Debug, Default)]
pub(crate) struct Buffered {
    data: Option<Bytes>,
    trailers: Option<Box<HeaderMap>>,
}

impl Buffered {
    fn poll_frame(&mut self) -> Option<Frame<Bytes>> {
        if let Some(data) = self.data.take() {
            return Some(Frame::data(data));
        }
        self.trailers.take().map(|t| Frame::trailers(*t))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    pub(crate) fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }
}

/// What reading a body up to a limit found.
pub(crate) enum Read<B> {
    /// The body ended within the limit.
    Complete(Buffered),
    /// The body is longer than the limit: the chunks read so far, then the rest.
    Over {
        prefix: VecDeque<Bytes>,
        rest: Pin<Box<B>>,
    },
}

/// Reads `body` until it ends or holds more than `limit` bytes.
///
/// An empty body costs nothing; a body whose size hint is already over the limit is not
/// read at all.
pub(crate) async fn read_up_to<B>(body: B, limit: usize) -> Result<Read<B>, B::Error>
where
    B: Body,
{
    if body.is_end_stream() {
        return Ok(Read::Complete(Buffered::default()));
    }
    let mut body = Box::pin(body);
    if body.size_hint().lower() > limit as u64 {
        return Ok(Read::Over {
            prefix: VecDeque::new(),
            rest: body,
        });
    }
    let mut chunks = Chunks::default();
    let mut trailers: Option<Box<HeaderMap>> = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(mut data) => {
                chunks.push(data.copy_to_bytes(data.remaining()));
                if chunks.total > limit {
                    return Ok(Read::Over {
                        prefix: chunks.into_deque(),
                        rest: body,
                    });
                }
            }
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    match &mut trailers {
                        Some(t) => t.extend(more),
                        None => trailers = Some(Box::new(more)),
                    }
                }
            }
        }
    }
    Ok(Read::Complete(Buffered {
        data: chunks.concat(),
        trailers,
    }))
}

/// The chunks read so far; a body of one chunk (the usual case) is kept without copying or
/// allocating.
#[derive(Default)]
struct Chunks {
    first: Option<Bytes>,
    more: Vec<Bytes>,
    total: usize,
}

impl Chunks {
    fn push(&mut self, chunk: Bytes) {
        self.total = self.total.saturating_add(chunk.len());
        match self.first {
            None => self.first = Some(chunk),
            Some(_) => self.more.push(chunk),
        }
    }

    fn concat(self) -> Option<Bytes> {
        let first = self.first?;
        if self.more.is_empty() {
            return Some(first);
        }
        let mut all = BytesMut::with_capacity(self.total);
        all.extend_from_slice(&first);
        for chunk in self.more {
            all.extend_from_slice(&chunk);
        }
        Some(all.freeze())
    }

    fn into_deque(self) -> VecDeque<Bytes> {
        self.first.into_iter().chain(self.more).collect()
    }
}

/// The body of each attempt the [`Retry`](super::Retry) service sends to the inner service.
///
/// It is either a copy of a request body that was read into memory (every attempt gets the
/// same bytes and trailers) or, for a body over the replay limit, the original stream (sent
/// once). `Unpin`, `Send` when `B` is, with `Bytes` data: what hyper's client asks of a body.
pub struct RequestBody<B> {
    kind: RequestKind<B>,
}

enum RequestKind<B> {
    Replay(Buffered),
    Once {
        prefix: VecDeque<Bytes>,
        rest: Pin<Box<B>>,
    },
}

impl<B> RequestBody<B> {
    pub(crate) fn replay(buffered: Buffered) -> Self {
        RequestBody {
            kind: RequestKind::Replay(buffered),
        }
    }

    pub(crate) fn once(prefix: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self {
        RequestBody {
            kind: RequestKind::Once { prefix, rest },
        }
    }
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            RequestKind::Replay(b) => f.debug_tuple("RequestBody::Replay").field(b).finish(),
            RequestKind::Once { prefix, .. } => f
                .debug_struct("RequestBody::Once")
                .field("prefix_chunks", &prefix.len())
                .finish_non_exhaustive(),
        }
    }
}

impl<B> Body for RequestBody<B>
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
        match &mut self.get_mut().kind {
            RequestKind::Replay(buffered) => Poll::Ready(buffered.poll_frame().map(Ok)),
            RequestKind::Once { prefix, rest } => poll_prefixed(prefix, rest.as_mut(), cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Replay(buffered) => buffered.is_end_stream(),
            RequestKind::Once { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Replay(buffered) => buffered.size_hint(),
            RequestKind::Once { prefix, rest } => add_hint(prefix, rest.size_hint()),
        }
    }
}

/// The request body as the layer holds it between attempts.
pub(crate) enum BodySource<B> {
    /// Read within the limit: every attempt gets a copy.
    Replayable(Buffered),
    /// Over the limit: the one attempt takes it.
    Once(Option<RequestBody<B>>),
}

impl<B> BodySource<B> {
    /// An empty body: replayable, and nothing to read or hold.
    pub(crate) fn empty() -> Self {
        BodySource::Replayable(Buffered::default())
    }

    pub(crate) fn from_read(read: Read<B>) -> Self {
        match read {
            Read::Complete(buffered) => BodySource::Replayable(buffered),
            Read::Over { prefix, rest } => BodySource::Once(Some(RequestBody::once(prefix, rest))),
        }
    }

    pub(crate) fn is_replayable(&self) -> bool {
        matches!(self, BodySource::Replayable(_))
    }

    /// The body for the next attempt; `None` when a body that cannot be replayed was sent
    /// already.
    pub(crate) fn for_attempt(&mut self) -> Option<RequestBody<B>> {
        match self {
            BodySource::Replayable(buffered) => Some(RequestBody::replay(buffered.clone())),
            BodySource::Once(body) => body.take(),
        }
    }
}

pin_project! {
    /// The body of a response from the [`Retry`](super::Retry) service.
    ///
    /// A plain HTTP response's body is passed through untouched; a gRPC response was read
    /// (to find its status in the trailers) and is handed back from memory, data and
    /// trailers as they arrived; a gRPC response over the read limit is the chunks read,
    /// then the rest of the original stream.
    pub struct ResponseBody<B> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseKindProj]
    enum ResponseKind<B> {
        Stream { #[pin] inner: B },
        Buffered { buffered: Buffered },
        Prefixed { prefix: VecDeque<Bytes>, rest: Pin<Box<B>> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn stream(inner: B) -> Self {
        ResponseBody {
            kind: ResponseKind::Stream { inner },
        }
    }

    pub(crate) fn from_read(read: Read<B>) -> Self {
        let kind = match read {
            Read::Complete(buffered) => ResponseKind::Buffered { buffered },
            Read::Over { prefix, rest } => ResponseKind::Prefixed { prefix, rest },
        };
        ResponseBody { kind }
    }

    /// The trailers, when the body was read to its end.
    pub(crate) fn buffered_trailers(&self) -> Option<&HeaderMap> {
        match &self.kind {
            ResponseKind::Buffered { buffered } => buffered.trailers(),
            _ => None,
        }
    }

    /// Whether the whole body was read (a gRPC response within the limit).
    pub(crate) fn is_complete(&self) -> bool {
        matches!(self.kind, ResponseKind::Buffered { .. })
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            ResponseKind::Stream { .. } => "stream",
            ResponseKind::Buffered { .. } => "buffered",
            ResponseKind::Prefixed { .. } => "prefixed",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B> Body for ResponseBody<B>
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
            ResponseKindProj::Stream { inner } => poll_mapped(inner, cx),
            ResponseKindProj::Buffered { buffered } => Poll::Ready(buffered.poll_frame().map(Ok)),
            ResponseKindProj::Prefixed { prefix, rest } => poll_prefixed(prefix, rest.as_mut(), cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Stream { inner } => inner.is_end_stream(),
            ResponseKind::Buffered { buffered } => buffered.is_end_stream(),
            ResponseKind::Prefixed { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Stream { inner } => inner.size_hint(),
            ResponseKind::Buffered { buffered } => buffered.size_hint(),
            ResponseKind::Prefixed { prefix, rest } => add_hint(prefix, rest.size_hint()),
        }
    }
}

fn poll_mapped<B>(
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let frame = ready!(body.poll_frame(cx));
    Poll::Ready(frame.map(|f| {
        f.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
            .map_err(Into::into)
    }))
}

fn poll_prefixed<B>(
    prefix: &mut VecDeque<Bytes>,
    rest: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    match prefix.pop_front() {
        Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
        None => poll_mapped(rest, cx),
    }
}

fn add_hint(prefix: &VecDeque<Bytes>, rest: SizeHint) -> SizeHint {
    let held: u64 = prefix.iter().map(|c| c.len() as u64).sum();
    let mut hint = SizeHint::new();
    hint.set_lower(rest.lower().saturating_add(held));
    if let Some(upper) = rest.upper() {
        hint.set_upper(upper.saturating_add(held));
    }
    hint
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::{Full, StreamBody};
    use std::convert::Infallible;

    fn chunks(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = Infallible> + use<> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    async fn all<B: Body<Data = Bytes>>(body: B) -> (Vec<u8>, Option<HeaderMap>)
    where
        B::Error: std::fmt::Debug,
    {
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        (collected.to_bytes().to_vec(), trailers)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_within_the_limit_is_replayed_identically() {
        let read = read_up_to(chunks(&["ab", "cd", "ef"]), 6).await.unwrap();
        let mut source = BodySource::from_read(read);
        assert!(source.is_replayable());
        for _ in 0..3 {
            let body = source.for_attempt().unwrap();
            assert_eq!(body.size_hint().exact(), Some(6));
            assert_eq!(all(body).await.0, b"abcdef");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn trailers_are_replayed_too() {
        let mut t = HeaderMap::new();
        t.insert("x-sum", "7".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"x"))),
            Ok(Frame::trailers(t.clone())),
        ];
        let read = read_up_to(StreamBody::new(futures::stream::iter(frames)), 8)
            .await
            .unwrap();
        let mut source = BodySource::from_read(read);
        let (data, trailers) = all(source.for_attempt().unwrap()).await;
        assert_eq!(data, b"x");
        assert_eq!(trailers, Some(t));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_over_the_limit_is_sent_whole_once() {
        let read = read_up_to(chunks(&["abcd", "efgh", "ij"]), 5)
            .await
            .unwrap();
        let mut source = BodySource::from_read(read);
        assert!(!source.is_replayable());
        assert_eq!(all(source.for_attempt().unwrap()).await.0, b"abcdefghij");
        assert!(source.for_attempt().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_size_hint_over_the_limit_is_not_read() {
        let read = read_up_to(Full::new(Bytes::from_static(b"0123456789")), 4)
            .await
            .unwrap();
        assert!(matches!(&read, Read::Over { prefix, .. } if prefix.is_empty()));
        let body = ResponseBody::from_read(read);
        assert!(!body.is_complete());
        assert_eq!(all(body).await.0, b"0123456789");
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_body_is_replayable_for_free() {
        let read = read_up_to(http_body_util::Empty::<Bytes>::new(), 0)
            .await
            .unwrap();
        let mut source = BodySource::from_read(read);
        let body = source.for_attempt().unwrap();
        assert!(body.is_end_stream());
        assert_eq!(all(body).await.0, b"");
    }
}
