//! The `--role load` of the sidecar bench: a fixed-rate, open-loop generator on a capped set
//! of keep-alive connections (wrk2's way of measuring latency without coordinated omission).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use super::BoxResult;

/// Connections of the fixed-rate generator: enough to carry 50 % of a proxy's maximum at
/// loopback latencies, few enough that no process runs out of file descriptors.
pub(crate) const LOAD_CONNECTIONS: usize = 64;

/// Open-loop load in the manner of wrk2: request `i` is *scheduled* at `start + i / rate`;
/// `connections` keep-alive connections take the next scheduled request as soon as they are
/// free and send it at its time (or at once, when it is already late). Latency is measured
/// from the scheduled time, so a stall that holds every connection shows up in the
/// percentiles of the requests that waited for it (no coordinated omission). Prints one JSON
/// line.
pub(crate) fn load(
    url: String,
    rate: u64,
    seconds: u64,
    method: String,
    connections: usize,
) -> BoxResult<()> {
    let uri: http::Uri = url.parse()?;
    let authority = uri.authority().ok_or("--url has no host:port")?.clone();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let method: http::Method = method.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async move {
        let total = rate * seconds;
        let period = Duration::from_nanos(1_000_000_000 / rate.max(1));
        let shared = Arc::new(LoadShared {
            next: AtomicU64::new(0),
            total,
            period,
            start: tokio::time::Instant::now() + Duration::from_millis(50),
            histogram: std::sync::Mutex::new(
                hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                    .map_err(|e| e.to_string())?,
            ),
            statuses: std::sync::Mutex::new(BTreeMap::new()),
            errors: AtomicU64::new(0),
            connects: AtomicU64::new(0),
        });
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..connections.max(1) {
            let (shared, authority, path, method) = (
                Arc::clone(&shared),
                authority.clone(),
                path.clone(),
                method.clone(),
            );
            tasks.spawn(async move { load_connection(&shared, &authority, &path, &method).await });
        }
        while tasks.join_next().await.is_some() {}
        let h = shared.histogram.lock().map_err(|e| e.to_string())?;
        let statuses = shared.statuses.lock().map_err(|e| e.to_string())?.clone();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(serde_json::json!({
            "sent": total,
            "connections": connections,
            "connects": shared.connects.load(Ordering::Relaxed),
            "errors": shared.errors.load(Ordering::Relaxed),
            "statuses": statuses,
            "p50_us": h.value_at_quantile(0.5),
            "p99_us": h.value_at_quantile(0.99),
            "p999_us": h.value_at_quantile(0.999),
            "max_us": h.max(),
        }))
    })?;
    println!("{summary}");
    Ok(())
}

/// What the generator's connections share: the schedule and the results.
struct LoadShared {
    next: AtomicU64,
    total: u64,
    period: Duration,
    start: tokio::time::Instant,
    histogram: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
    statuses: std::sync::Mutex<BTreeMap<u16, u64>>,
    errors: AtomicU64,
    connects: AtomicU64,
}

/// One keep-alive connection of the generator: takes scheduled requests until none are
/// left; reconnects after an error (which is counted, and its request not retried).
async fn load_connection(
    shared: &LoadShared,
    authority: &http::uri::Authority,
    path: &str,
    method: &http::Method,
) {
    let mut sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> = None;
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= shared.total {
            return;
        }
        let scheduled = shared.start + shared.period * u32::try_from(i).unwrap_or(u32::MAX);
        tokio::time::sleep_until(scheduled).await;
        let kept = match sender.take() {
            Some(mut s) => s.ready().await.is_ok().then_some(s),
            None => None,
        };
        let ready = match kept {
            Some(s) => Some(s),
            None => {
                shared.connects.fetch_add(1, Ordering::Relaxed);
                connect_load(authority).await
            }
        };
        let Some(mut s) = ready else {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, authority.as_str())
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")));
        let Ok(request) = request else {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match s.send_request(request).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let complete = response.into_body().collect().await.is_ok();
                let micros = u64::try_from(scheduled.elapsed().as_micros()).unwrap_or(u64::MAX);
                if let Ok(mut h) = shared.histogram.lock() {
                    h.saturating_record(micros.max(1));
                }
                if let Ok(mut statuses) = shared.statuses.lock() {
                    *statuses.entry(status).or_default() += 1;
                }
                if complete {
                    sender = Some(s);
                }
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn connect_load(
    authority: &http::uri::Authority,
) -> Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}
