//! The responses the server layer answers with itself: deadline exceeded, and (if configured)
//! a malformed deadline header. HTTP callers get a status code and a one-line text body; gRPC
//! callers get a *trailers-only* response, the form gRPC uses for a call that fails before any
//! message: HTTP 200, `content-type: application/grpc` and `grpc-status` in the headers, with
//! an empty body that ends the stream.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{Either, Full};

/// The response body of [`DeadlineService`](super::DeadlineService): the inner service's body,
/// or the layer's own short body when it answered by itself.
///
/// Both axum and tonic accept it: it is an [`http_body::Body`] with `Data = Bytes` whenever the
/// inner body is, and its error is a boxed error.
pub type DeadlineBody<B> = Either<B, Full<Bytes>>;

/// gRPC status code `INVALID_ARGUMENT`.
const GRPC_INVALID_ARGUMENT: &str = "3";
/// gRPC status code `DEADLINE_EXCEEDED`.
const GRPC_DEADLINE_EXCEEDED: &str = "4";

/// Whether the request is gRPC: its content type is `application/grpc` or a subtype
/// (`application/grpc+proto`, `application/grpc-web`, ...).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const PREFIX: &[u8] = b"application/grpc";
    headers.get(CONTENT_TYPE).is_some_and(|value| {
        value
            .as_bytes()
            .get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
    })
}

/// 504 for HTTP, `DEADLINE_EXCEEDED` for gRPC.
pub(crate) fn deadline_exceeded<B>(grpc: bool) -> Response<DeadlineBody<B>> {
    if grpc {
        grpc_trailers_only(GRPC_DEADLINE_EXCEEDED, "deadline exceeded")
    } else {
        text(StatusCode::GATEWAY_TIMEOUT, "deadline exceeded".to_owned())
    }
}

/// 400 for HTTP, `INVALID_ARGUMENT` for gRPC, with `reason` as the message.
pub(crate) fn invalid_header<B>(grpc: bool, reason: &str) -> Response<DeadlineBody<B>> {
    if grpc {
        grpc_trailers_only(GRPC_INVALID_ARGUMENT, reason)
    } else {
        text(StatusCode::BAD_REQUEST, reason.to_owned())
    }
}

fn text<B>(status: StatusCode, mut message: String) -> Response<DeadlineBody<B>> {
    message.push('\n');
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(message))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn grpc_trailers_only<B>(code: &'static str, message: &str) -> Response<DeadlineBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
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

    #[test]
    fn grpc_detection() {
        let ct = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
            h
        };
        assert!(is_grpc(&ct("application/grpc")));
        assert!(is_grpc(&ct("application/grpc+proto")));
        assert!(is_grpc(&ct("Application/GRPC")));
        assert!(!is_grpc(&ct("application/json")));
        assert!(!is_grpc(&ct("application/grp")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn grpc_reply_is_trailers_only() {
        let response = deadline_exceeded::<Full<Bytes>>(true);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert_eq!(response.headers()["grpc-status"], "4");
        assert_eq!(response.headers()["grpc-message"], "deadline exceeded");
        assert!(response.body().is_end_stream());
    }

    #[test]
    fn http_replies() {
        let response = deadline_exceeded::<Full<Bytes>>(false);
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        let response = invalid_header::<Full<Bytes>>(false, "bad");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.body().size_hint().exact(), Some(4));
        let response = invalid_header::<Full<Bytes>>(true, "100% \u{e9}\n");
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
