//! The accept loop: one port that speaks HTTP/1.1 and HTTP/2 cleartext (prior knowledge, as
//! gRPC clients use it), each connection served on its own task.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::util::BoxCloneService;

/// What a proxy serves: every request gets a response (the proxy's own answer when the
/// upstream gave none).
pub(crate) type ProxyService = BoxCloneService<Request<Incoming>, Response<Body>, Infallible>;

/// The pause after a failed accept, doubling while accepts keep failing: out of file
/// descriptors, an immediate retry fails again at once and would spin a core exactly when
/// the machine is overloaded.
const ACCEPT_PAUSE: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(200));

/// Serves `service` on `listener` until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, service: ProxyService) {
    let mut pause = ACCEPT_PAUSE.0;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => {
                pause = ACCEPT_PAUSE.0;
                accepted
            }
            // Out of file descriptors, or a connection reset before it was accepted: the
            // listener is still good; try again after a pause.
            Err(error) => {
                tracing::warn!(%error, ?pause, "stormguard proxy: accept failed");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ACCEPT_PAUSE.1);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %error, "stormguard proxy: connection ended with an error");
            }
        });
    }
}
