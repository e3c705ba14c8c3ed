//! Buffering a response body up to a cap without ever truncating what the client receives.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;

/// A body that was read up to a cap.
pub(crate) enum Buffered<B> {
    /// The whole body (data frames only; trailers are not kept).
    Complete(Bytes),
    /// The body went over the cap: what was read, and the rest still to stream.
    TooLarge(Prefixed<B>),
    /// The body failed.
    Failed(BoxError),
}

pub(crate) async fn buffer_capped<B>(body: B, cap: usize) -> Buffered<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut head: VecDeque<Bytes> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(e)) => return Buffered::Failed(e.into()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    len = len.saturating_add(data.len());
                    head.push_back(data);
                    if len > cap {
                        return Buffered::TooLarge(Prefixed { head, rest: body });
                    }
                }
            }
        }
    }
    if head.len() == 1 {
        return Buffered::Complete(head.pop_front().unwrap_or_default());
    }
    let mut all = Vec::with_capacity(len);
    for chunk in head {
        all.extend_from_slice(&chunk);
    }
    Buffered::Complete(Bytes::from(all))
}

/// Chunks already read, then the rest of the body.
pub(crate) struct Prefixed<B> {
    head: VecDeque<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.head.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        this.rest.as_mut().poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.rest.is_end_stream()
    }
}
