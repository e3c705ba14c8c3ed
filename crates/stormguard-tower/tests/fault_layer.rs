//! `FaultLayer` in front of in-process services under tokio's paused clock (statuses,
//! resets, delays, rates, switching at run time), and once over real HTTP/1 on 127.0.0.1.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
use stormguard_tower::fault::{FAULT_HEADER, FaultLayer};
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

const MS: Duration = Duration::from_millis(1);

fn injector(config: FaultConfig) -> Arc<FaultInjector> {
    Arc::new(FaultInjector::new(config).unwrap())
}

/// A service answering 200 after `work`, recording when each call reached it.
fn downstream(
    work: Duration,
    seen: Arc<Mutex<Vec<Instant>>>,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(move |_req: Request<()>| {
        seen.lock().unwrap().push(Instant::now());
        async move {
            tokio::time::sleep(work).await;
            Ok::<_, Infallible>(Response::new(Full::from("ok")))
        }
    })
}

async fn send<S>(svc: &mut S) -> Result<Response<Full<Bytes>>, BoxError>
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = BoxError>,
{
    svc.ready().await?.call(Request::new(())).await
}

#[tokio::test(start_paused = true)]
async fn a_status_abort_answers_without_calling_the_service() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shed = Abort::Status {
        status: 503,
        retry_after: Some(1500 * MS),
    };
    let mut svc = ServiceBuilder::new()
        .layer(FaultLayer::new(injector(
            FaultConfig::new(1).with_abort(1.0, shed),
        )))
        .service(downstream(10 * MS, seen.clone()));
    let response = send(&mut svc).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["retry-after"],
        "2",
        "rounded up to whole seconds"
    );
    assert_eq!(response.headers()[FAULT_HEADER], "abort");
    assert!(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty()
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reset_is_a_connection_reset_error() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut svc = ServiceBuilder::new()
        .layer(FaultLayer::new(injector(
            FaultConfig::new(1).with_abort(1.0, Abort::Reset),
        )))
        .service(downstream(10 * MS, seen.clone()));
    let err = send(&mut svc).await.unwrap_err();
    let io = err.downcast_ref::<io::Error>().unwrap();
    assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(
        io.get_ref().and_then(|e| e.downcast_ref::<Abort>()),
        Some(&Abort::Reset)
    );
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_delay_comes_before_the_call_and_before_an_abort() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let faults = injector(FaultConfig::new(1).with_latency(1.0, Latency::Fixed(200 * MS)));
    let mut svc = ServiceBuilder::new()
        .layer(FaultLayer::new(faults.clone()))
        .service(downstream(10 * MS, seen.clone()));
    let start = Instant::now();
    assert_eq!(send(&mut svc).await.unwrap().status(), StatusCode::OK);
    assert_eq!(start.elapsed(), 210 * MS);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![start + 200 * MS],
        "called after the delay"
    );

    faults.set_abort_rate(1.0).unwrap();
    let start = Instant::now();
    assert_eq!(
        send(&mut svc).await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(start.elapsed(), 200 * MS);
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "an abort never reaches the service"
    );
}

#[tokio::test(start_paused = true)]
async fn rates_hold_and_switch_at_run_time() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let faults = injector(FaultConfig::new(9).with_abort(0.25, Abort::Reset));
    let mut svc = ServiceBuilder::new()
        .layer(FaultLayer::new(faults.clone()))
        .service(downstream(Duration::ZERO, seen.clone()));
    let mut resets = 0;
    for _ in 0..4000 {
        resets += u32::from(send(&mut svc).await.is_err());
    }
    assert!((900..=1100).contains(&resets), "{resets}");
    assert_eq!(u64::from(resets), faults.stats().aborted);
    assert_eq!(seen.lock().unwrap().len(), 4000 - resets as usize);

    faults.disable();
    for _ in 0..100 {
        send(&mut svc).await.unwrap();
    }
    faults.enable();
    faults.set_abort_rate(1.0).unwrap();
    for _ in 0..100 {
        assert!(send(&mut svc).await.is_err());
    }
    assert_eq!(
        faults.stats().calls,
        4100,
        "calls while disabled are not counted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bimodal_downstream() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tail = Latency::Bimodal {
        fast: 10 * MS,
        slow: 500 * MS,
        slow_share: 0.05,
    };
    let mut svc = ServiceBuilder::new()
        .layer(FaultLayer::new(injector(
            FaultConfig::new(4).with_latency(1.0, tail),
        )))
        .service(downstream(Duration::ZERO, seen));
    let mut slow = 0;
    for _ in 0..2000 {
        let start = Instant::now();
        send(&mut svc).await.unwrap();
        let took = start.elapsed();
        assert!(took == 10 * MS || took == 500 * MS, "{took:?}");
        slow += u32::from(took == 500 * MS);
    }
    assert!((60..=140).contains(&slow), "{slow}");
}

/// Serves `svc` over HTTP/1 on 127.0.0.1 until the test ends; returns the address.
async fn serve<S>(svc: S) -> std::net::SocketAddr
where
    S: Service<Request<hyper::body::Incoming>, Response = Response<Full<Bytes>>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |req| svc.clone().oneshot(req));
                let io = hyper_util::rt::TokioIo::new(stream);
                // A service error (an injected reset) makes hyper drop the connection.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, handler)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn over_real_http_a_status_arrives_and_a_reset_drops_the_connection() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let app = tower::service_fn(move |_req: Request<hyper::body::Incoming>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::from("real"))) }
    });
    let faults = injector(FaultConfig::new(1).with_abort(
        1.0,
        Abort::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(3)),
        },
    ));
    let addr = serve(
        ServiceBuilder::new()
            .layer(FaultLayer::new(faults.clone()))
            .service(app.clone()),
    )
    .await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let get = |addr: std::net::SocketAddr| {
        let request = Request::get(format!("http://{addr}/"))
            .body(Full::default())
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), client.request(request))
    };

    let response = get(addr).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
    assert_eq!(response.headers()[FAULT_HEADER], "abort");

    faults.disable();
    let response = get(addr).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "real"
    );

    // The abort kind is fixed per injector: resets come from a second server.
    let resets = injector(FaultConfig::new(1).with_abort(1.0, Abort::Reset));
    let addr = serve(
        ServiceBuilder::new()
            .layer(FaultLayer::new(resets))
            .service(app),
    )
    .await;
    let err = get(addr).await.unwrap().unwrap_err();
    assert!(
        !err.is_connect(),
        "connected, then the connection was dropped: {err:?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the request sent while disabled arrived"
    );
}
