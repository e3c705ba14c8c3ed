//! The `--role load` of the sidecar bench: a fixed-rate, open-loop generator on a capped set
//! of keep-alive connections (wrk2's way of measuring latency without coordinated omission).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Semaphore;

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
///
/// The schedule is kept by [`pace`], on the kernel's high-resolution timer that [`arm`] sets,
/// not by tokio's timer: [`arm`] says why.
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
        let total = rate
            .checked_mul(seconds)
            .ok_or("--rate × --seconds overflows")?;
        let period = Duration::from_nanos(1_000_000_000 / rate.max(1));
        if period.is_zero() {
            // a zero interval would make the timer fire once, not periodically
            return Err("--rate is above one request per nanosecond".into());
        }
        let (timer, start) = arm(Duration::from_millis(50), period)?;
        let shared = Arc::new(LoadShared {
            next: AtomicU64::new(0),
            due: Semaphore::new(0),
            total,
            period,
            start,
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
        pace(&timer, &shared.due, total).await?;
        // one more permit per connection, for it to see that nothing is left
        shared.due.add_permits(connections.max(1));
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

/// Arms the generator's clock: a periodic timerfd (the kernel's high-resolution timer) that
/// expires first `lead` from now and then every `period`. Returns it with the instant of its
/// first expiration, the schedule's start (request `i` is due at `start + i * period`).
///
/// tokio's timer would round each request's sleep up to its next millisecond tick: with it,
/// every request left 1 to 2 ms after its scheduled time (1.6 ms at the median against the
/// upstream directly, at 1,000 requests/s), and each tick let a millisecond's worth of
/// requests go at once, so what a proxy "added" was mostly the time it took to work through
/// that burst.
fn arm(lead: Duration, period: Duration) -> BoxResult<(AsyncFd<OwnedFd>, Instant)> {
    let timer = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    // `Instant` reads the same monotonic clock on Linux: the two reads are nanoseconds apart
    let now = clock_gettime(ClockId::Monotonic);
    let start = Instant::now() + lead;
    let first = Duration::new(u64::try_from(now.tv_sec)?, u32::try_from(now.tv_nsec)?) + lead;
    timerfd_settime(
        &timer,
        TimerfdTimerFlags::ABSTIME,
        &Itimerspec {
            it_interval: timespec(period)?,
            it_value: timespec(first)?,
        },
    )?;
    Ok((register(timer)?, start))
}

/// The timer in the runtime's reactor, so that its expirations wake the generator's own
/// thread: a second thread reading it would cost a wake-up of each thread per release, on
/// the core the generator shares with the upstream.
#[expect(
    unsafe_code,
    reason = "tokio's only way to poll a file descriptor it did not open"
)]
fn register(timer: OwnedFd) -> BoxResult<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the descriptor and closes it only when dropped, after
    // deregistering it; nothing else holds it, so it stays open and unchanged while registered.
    Ok(
        unsafe { AsyncFd::register_with_interest(timer, Interest::READABLE) }
            .map_err(std::io::Error::from)?,
    )
}

/// Keeps the schedule: one permit on `due` for each request whose time has come, until
/// `total` have been released. Each read of the timer gives the number of periods that have
/// passed since the last read, so a late wake-up releases every request that became due
/// meanwhile, and the schedule never drifts.
async fn pace(timer: &AsyncFd<OwnedFd>, due: &Semaphore, total: u64) -> BoxResult<()> {
    let mut released = 0;
    while released < total {
        let mut ready = timer.readable().await?;
        let mut expirations = [0u8; 8];
        let Ok(read) = ready.try_io(|fd| Ok(rustix::io::read(fd, &mut expirations)?)) else {
            continue; // woken with nothing to read: wait again
        };
        read?;
        let passed = u64::from_ne_bytes(expirations).min(total - released);
        due.add_permits(usize::try_from(passed)?);
        released += passed;
    }
    Ok(())
}

fn timespec(duration: Duration) -> BoxResult<Timespec> {
    Ok(Timespec {
        tv_sec: i64::try_from(duration.as_secs())?,
        tv_nsec: i64::from(duration.subsec_nanos()),
    })
}

/// What the generator's connections share: the schedule and the results.
struct LoadShared {
    next: AtomicU64,
    /// One permit per request whose scheduled time has come (see [`pace`]).
    due: Semaphore,
    total: u64,
    period: Duration,
    start: Instant,
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
        let Ok(permit) = shared.due.acquire().await else {
            return;
        };
        permit.forget();
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= shared.total {
            return;
        }
        let scheduled = shared.start + shared.period * u32::try_from(i).unwrap_or(u32::MAX);
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
