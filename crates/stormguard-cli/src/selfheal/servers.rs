//! The image service's side of the story: the origin, the CDN stand-in in front of it, and
//! the backup source, each a real HTTP server on 127.0.0.1.
//!
//! The CDN stand-in fetches every image from the origin, as a CDN node on a cache miss
//! does, until it is switched to fail: then it answers `504 Gateway Timeout` at once, as a
//! node that lost its upstream does. The backup source holds its own copy of every image
//! (a second bucket): it answers without the origin or the CDN, so a switch to it does not
//! depend on what failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::timeline::{Mark, Timeline};

/// The path of every image, on every server: `/img/{name}`.
pub(crate) const IMAGE_ROUTE: &str = "/img/{name}";

/// A plain HTTP/1 client for the servers' own calls (the CDN to the origin, the fallback to
/// the backup source): their calls are not the clients' and go through no policy.
pub(crate) type PlainClient = Client<HttpConnector, Empty<Bytes>>;

/// A plain client.
pub(crate) fn plain_client() -> PlainClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A server task, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Serving {
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    task: JoinHandle<()>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `router` on a free port of 127.0.0.1.
pub(crate) async fn serve(router: Router) -> Result<Serving, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("binding 127.0.0.1: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("reading the bound address: {e}"))?;
    let task = tokio::spawn(async move {
        // Ends only with an accept error; the demo's clients then see refused connections.
        let _ = axum::serve(listener, router).await;
    });
    Ok(Serving {
        url: format!("http://{addr}"),
        task,
    })
}

/// The switch of the CDN stand-in: serving, or answering 504.
#[derive(Debug)]
pub(crate) struct CdnSwitch {
    failing: AtomicBool,
    timeline: Arc<Timeline>,
}

impl CdnSwitch {
    /// Makes the CDN answer 504 (`true`) or serve again (`false`), and marks when.
    pub(crate) fn set_failing(&self, failing: bool) {
        self.timeline.mark(if failing {
            Mark::CdnFailing
        } else {
            Mark::CdnRecovered
        });
        self.failing.store(failing, Ordering::SeqCst);
    }
}

/// The three servers.
#[derive(Debug)]
pub(crate) struct ImageService {
    /// The CDN stand-in, which the clients call.
    pub(crate) cdn: Serving,
    /// The backup source, which the clients' fallback calls.
    pub(crate) backup: Serving,
    /// The origin behind the CDN (served while this lives).
    _origin: Serving,
    /// The CDN's switch.
    pub(crate) switch: Arc<CdnSwitch>,
}

#[derive(Clone)]
struct Cdn {
    switch: Arc<CdnSwitch>,
    origin: String,
    client: PlainClient,
}

impl ImageService {
    /// Starts the origin, the CDN stand-in (serving) and the backup source.
    pub(crate) async fn start(timeline: &Arc<Timeline>) -> Result<ImageService, String> {
        let origin = serve(Router::new().route(IMAGE_ROUTE, get(origin_image))).await?;
        let switch = Arc::new(CdnSwitch {
            failing: AtomicBool::new(false),
            timeline: Arc::clone(timeline),
        });
        let cdn = Cdn {
            switch: Arc::clone(&switch),
            origin: origin.url.clone(),
            client: plain_client(),
        };
        let cdn = serve(
            Router::new()
                .route(IMAGE_ROUTE, get(cdn_image))
                .with_state(cdn),
        )
        .await?;
        let backup = serve(Router::new().route(IMAGE_ROUTE, get(backup_image))).await?;
        Ok(ImageService {
            cdn,
            backup,
            _origin: origin,
            switch,
        })
    }
}

async fn origin_image(Path(name): Path<String>) -> String {
    format!("image {name} from the origin")
}

async fn backup_image(Path(name): Path<String>) -> String {
    format!("image {name} from the backup source")
}

async fn cdn_image(State(cdn): State<Cdn>, Path(name): Path<String>) -> Response {
    if cdn.switch.failing.load(Ordering::SeqCst) {
        cdn.switch.timeline.cdn_504();
        return (
            StatusCode::GATEWAY_TIMEOUT,
            "the CDN node lost its upstream",
        )
            .into_response();
    }
    match fetch(&cdn.client, &format!("{}/img/{name}", cdn.origin)).await {
        Some((StatusCode::OK, body)) => (StatusCode::OK, body).into_response(),
        _ => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// `GET url` with a plain client: the status and the body, or `None` when there was no
/// answer.
pub(crate) async fn fetch(client: &PlainClient, url: &str) -> Option<(StatusCode, Bytes)> {
    let uri: http::Uri = url.parse().ok()?;
    let response = client.get(uri).await.ok()?;
    let status = response.status();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}
