//! The responses the server layer answers with itself: deadline exceeded, and (if configured)
//! a malformed deadline header, in the form the caller speaks ([`Protocol::of`] the request).
//!
//! - HTTP callers get a status code (504 or 400) and a one-line text body.
//! - gRPC callers get a *trailers-only* response, the form gRPC uses for a call that fails
//!   before any message: HTTP 200, `content-type: application/grpc` and `grpc-status` /
//!   `grpc-message` in the headers, with an empty body that ends the stream.
//! - gRPC-Web callers get the same trailers-only response in gRPC-Web form: HTTP 200, the
//!   request's own content type (`application/grpc-web+proto`, `application/grpc-web-text`, …,
//!   so the reply is in the encoding the caller asked for) and the status in the headers. The
//!   gRPC-Web protocol allows a trailers-only response exactly so, and gRPC-Web clients read
//!   the status from the headers when the body carries no trailer frame. Answering a browser
//!   with a plain 504 instead would surface as an `UNKNOWN` or `UNAVAILABLE` error, not as
//!   `DEADLINE_EXCEEDED`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{Either, Full};

use crate::wire::{GRPC_MESSAGE, GRPC_PUSHBACK, GRPC_STATUS, Protocol};

/// The response body of [`Deadline`](super::Deadline): the inner service's body, or the
/// layer's own short body when it answered by itself.
///
/// Both axum and tonic accept it: it is an [`http_body::Body`] with `Data = Bytes` whenever the
/// inner body is, and its error is a boxed error.
pub type DeadlineBody<B> = Either<B, Full<Bytes>>;

/// gRPC status code `INVALID_ARGUMENT`.
const GRPC_INVALID_ARGUMENT: &str = "3";
/// gRPC status code `DEADLINE_EXCEEDED`.
const GRPC_DEADLINE_EXCEEDED: &str = "4";
/// gRPC status code `RESOURCE_EXHAUSTED`.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";

/// How to answer one request: decided from its headers before the handler runs, because the
/// handler takes the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReplyForm {
    /// A status code and a text body.
    Http,
    /// A gRPC trailers-only response.
    Grpc,
    /// A gRPC-Web trailers-only response, with the request's content type.
    GrpcWeb(HeaderValue),
}

impl ReplyForm {
    /// The form for a request with these headers.
    pub(crate) fn of(headers: &HeaderMap) -> ReplyForm {
        match Protocol::of(headers) {
            Protocol::Http => ReplyForm::Http,
            Protocol::Grpc => ReplyForm::Grpc,
            Protocol::GrpcWeb => match headers.get(CONTENT_TYPE) {
                Some(content_type) => ReplyForm::GrpcWeb(content_type.clone()),
                // `Protocol::of` found a gRPC-Web content type, so this is unreachable; the
                // bare gRPC-Web type is the right answer anyway.
                None => ReplyForm::GrpcWeb(HeaderValue::from_static("application/grpc-web")),
            },
        }
    }

    /// 504 for HTTP, `DEADLINE_EXCEEDED` for gRPC and gRPC-Web.
    pub(crate) fn deadline_exceeded<B>(self) -> Response<DeadlineBody<B>> {
        self.reply(
            StatusCode::GATEWAY_TIMEOUT,
            GRPC_DEADLINE_EXCEEDED,
            "deadline exceeded",
        )
    }

    /// 400 for HTTP, `INVALID_ARGUMENT` for gRPC and gRPC-Web, with `reason` as the message.
    pub(crate) fn invalid_header<B>(self, reason: &str) -> Response<DeadlineBody<B>> {
        self.reply(StatusCode::BAD_REQUEST, GRPC_INVALID_ARGUMENT, reason)
    }

    /// The server shed the request: 503 with `Retry-After` (whole seconds, rounded up) for
    /// HTTP; `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` for gRPC and gRPC-Web (gRPC
    /// A6: the client waits that long before retrying). Either way a stormguard client reads
    /// it as overloaded and does not retry sooner.
    pub(crate) fn overloaded<B>(
        self,
        retry_after: Duration,
        reason: &str,
    ) -> Response<DeadlineBody<B>> {
        let grpc = !matches!(self, ReplyForm::Http);
        let mut response = self.reply(
            StatusCode::SERVICE_UNAVAILABLE,
            GRPC_RESOURCE_EXHAUSTED,
            reason,
        );
        let headers = response.headers_mut();
        let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        if grpc {
            headers.insert(GRPC_PUSHBACK, HeaderValue::from(millis));
        } else {
            headers.insert(RETRY_AFTER, HeaderValue::from(millis.div_ceil(1000)));
        }
        response
    }

    fn reply<B>(
        self,
        status: StatusCode,
        grpc_code: &'static str,
        message: &str,
    ) -> Response<DeadlineBody<B>> {
        match self {
            ReplyForm::Http => text(status, message),
            ReplyForm::Grpc => trailers_only(
                HeaderValue::from_static("application/grpc"),
                grpc_code,
                message,
            ),
            ReplyForm::GrpcWeb(content_type) => trailers_only(content_type, grpc_code, message),
        }
    }
}

fn text<B>(status: StatusCode, message: &str) -> Response<DeadlineBody<B>> {
    let mut body = String::with_capacity(message.len() + 1);
    body.push_str(message);
    body.push('\n');
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn trailers_only<B>(
    content_type: HeaderValue,
    code: &'static str,
    message: &str,
) -> Response<DeadlineBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS, HeaderValue::from_static(code));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    response
}

/// Percent-encodes a `grpc-message` as the gRPC HTTP/2 protocol asks: every byte outside
/// printable ASCII (0x20–0x7E), and `%` itself, becomes `%XX`.
fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use proptest::prelude::*;

    fn form(content_type: &'static str) -> ReplyForm {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        ReplyForm::of(&headers)
    }

    #[test]
    fn the_form_follows_the_one_protocol_detection() {
        assert_eq!(ReplyForm::of(&HeaderMap::new()), ReplyForm::Http);
        assert_eq!(form("application/json"), ReplyForm::Http);
        assert_eq!(form("application/grpcx"), ReplyForm::Http);
        assert_eq!(form("application/grpc"), ReplyForm::Grpc);
        assert_eq!(form("Application/GRPC+proto"), ReplyForm::Grpc);
        assert_eq!(
            form("application/grpc-web-text+proto"),
            ReplyForm::GrpcWeb(HeaderValue::from_static("application/grpc-web-text+proto"))
        );
    }

    #[test]
    fn grpc_reply_is_trailers_only() {
        let response = form("application/grpc+proto").deadline_exceeded::<Full<Bytes>>();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert_eq!(response.headers()["grpc-status"], "4");
        assert_eq!(response.headers()["grpc-message"], "deadline exceeded");
        assert!(response.body().is_end_stream());
    }

    #[test]
    fn grpc_web_reply_is_trailers_only_in_the_callers_encoding() {
        let response = form("application/grpc-web+proto").deadline_exceeded::<Full<Bytes>>();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "application/grpc-web+proto"
        );
        assert_eq!(response.headers()["grpc-status"], "4");
        assert!(response.body().is_end_stream());
        let response = form("application/grpc-web-text").invalid_header::<Full<Bytes>>("bad");
        assert_eq!(
            response.headers()["content-type"],
            "application/grpc-web-text"
        );
        assert_eq!(response.headers()["grpc-status"], "3");
        assert_eq!(response.headers()["grpc-message"], "bad");
    }

    #[test]
    fn overloaded_replies_carry_the_pushback() {
        let response =
            ReplyForm::Http.overloaded::<Full<Bytes>>(Duration::from_millis(1200), "shed");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "2");
        let response =
            form("application/grpc").overloaded::<Full<Bytes>>(Duration::from_millis(1200), "shed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(response.headers()["grpc-retry-pushback-ms"], "1200");
    }

    #[test]
    fn http_replies() {
        let response = ReplyForm::Http.deadline_exceeded::<Full<Bytes>>();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(response.body().size_hint().exact(), Some(18));
        let response = ReplyForm::Http.invalid_header::<Full<Bytes>>("bad");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.body().size_hint().exact(), Some(4));
        let response = ReplyForm::Grpc.invalid_header::<Full<Bytes>>("100% \u{e9}\n");
        assert_eq!(response.headers()["grpc-status"], "3");
        assert_eq!(response.headers()["grpc-message"], "100%25 %C3%A9%0A");
    }

    proptest! {
        #[test]
        fn percent_encoding_is_a_valid_header_and_round_trips(s in any::<String>()) {
            let encoded = percent_encode(&s);
            prop_assert!(HeaderValue::from_str(&encoded).is_ok());
            let mut decoded = Vec::new();
            let mut bytes = encoded.bytes();
            while let Some(b) = bytes.next() {
                if b == b'%' {
                    let hi = bytes.next().and_then(|c| char::from(c).to_digit(16));
                    let lo = bytes.next().and_then(|c| char::from(c).to_digit(16));
                    prop_assert!(hi.is_some() && lo.is_some());
                    let v = hi.unwrap_or(0) * 16 + lo.unwrap_or(0);
                    decoded.push(u8::try_from(v).unwrap_or(0));
                } else {
                    decoded.push(b);
                }
            }
            prop_assert_eq!(decoded, s.into_bytes());
        }
    }
}
