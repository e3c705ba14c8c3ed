//! The seeds' deadline budget table, live: a gateway and three services (gateway → A → B → C)
//! as axum servers on 127.0.0.1, each behind stormguard's deadline layers.
//!
//! | hop | receives | own timeout | hands downstream |
//! | --- | --- | --- | --- |
//! | gateway | 1000 ms | 950 ms | 900 ms |
//! | A | 900 ms | 800 ms | 600 ms |
//! | B | 600 ms | 450 ms | 300 ms |
//! | C | 300 ms | 300 ms | — |
//!
//! Each hop runs behind [`DeadlineLayer`]: its handler runs under the deadline the request
//! announced (the gateway, as the entry, gives a request without one its budget of 1000 ms),
//! and is cancelled when that passes. The handler bounds its own work by its *own timeout*, the
//! budget minus a margin to still answer its caller in time (50, 100, 150 and 0 ms), and calls
//! the next hop through [`PropagateDeadlineLayer`] with its *reserve* (10 %, then 300 ms, then
//! 300 ms), so the next hop receives what this one received minus the reserve.
//!
//! # What a hop answers when the next hop fails
//!
//! | the next hop | this hop answers | why |
//! | --- | --- | --- |
//! | 2xx | 200, with the next hop's body | |
//! | 504 Gateway Timeout | 504 | the deadline ran out below; it is the same deadline up here, so the caller learns that time ran out, not that something broke |
//! | 503 Service Unavailable | 503 | the chain below cannot serve now; the caller's rules for 503 (back off, honour `Retry-After`) apply to the chain as a whole |
//! | any other status (4xx, 500, 502, …), or no answer at all | 502 Bad Gateway | the next hop failed or refused what this hop sent it: this hop's bad gateway, never the caller's fault (so never a 4xx) |
//! | not called: too little time left for it ([`DeadlineTooClose`]) | 504 | |
//! | too slow: the hop's own timeout fired | 504 | |
//!
//! The body says what happened where it happened: a hop's own answers carry [`ANSWERED_BY`]
//! and are passed up unchanged; any other failure (a deadline layer's 504, a refused
//! connection) is described once, by the hop that saw it (`C answered 504 Gateway Timeout:
//! deadline exceeded`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::admission::DeadlineTooClose;
use stormguard::clock::Clock;
use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, Reserve, WallClock};
use stormguard_tower::deadline::{
    DeadlineLayer, IncomingDeadline, PropagateDeadline, PropagateDeadlineLayer,
};
use stormguard_tower::wire::BoxError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// The HTTP client the hops (and the demo's caller) use.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new HTTP/1 client.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The budget the gateway gives a request that arrives without a deadline.
pub const ENTRY_BUDGET: Duration = Duration::from_millis(1000);

/// The response header naming the hop whose handler wrote the answer (absent when a
/// deadline layer answered by itself).
pub const ANSWERED_BY: HeaderName = HeaderName::from_static("x-relay-answered-by");

/// One hop's configuration.
#[derive(Clone, Copy, Debug)]
pub struct HopSpec {
    /// The hop's name.
    pub name: &'static str,
    /// Subtracted from the budget received to get the hop's own timeout: time to still answer
    /// the caller after giving up.
    pub own_margin: Duration,
    /// What the hop keeps when it hands the rest of the deadline to the next hop.
    pub reserve: Reserve,
    /// The hop's own work before it calls the next hop (or answers).
    pub work: Duration,
}

/// The seeds' four hops; C's own work takes `c_work`.
pub fn seeds_hops(c_work: Duration) -> [HopSpec; 4] {
    let ms = Duration::from_millis;
    // 0.1 is a valid fraction; `Reserve::NONE` would only be reached if it were not.
    let ten_percent = Reserve::fraction(0.1).unwrap_or(Reserve::NONE);
    [
        HopSpec {
            name: "gateway",
            own_margin: ms(50),
            reserve: ten_percent,
            work: Duration::ZERO,
        },
        HopSpec {
            name: "A",
            own_margin: ms(100),
            reserve: Reserve::fixed(ms(300)),
            work: Duration::ZERO,
        },
        HopSpec {
            name: "B",
            own_margin: ms(150),
            reserve: Reserve::fixed(ms(300)),
            work: Duration::ZERO,
        },
        HopSpec {
            name: "C",
            own_margin: Duration::ZERO,
            reserve: Reserve::NONE,
            work: c_work,
        },
    ]
}

/// How a hop's handling of the request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still running (only seen while the chain is in flight).
    Running,
    /// The handler answered with this status.
    Answered(StatusCode),
    /// The hop's own timeout fired and it answered 504 itself.
    OwnTimeout,
    /// The deadline layer cancelled the handler: its work was abandoned.
    Cancelled,
}

/// What one hop saw and did.
#[derive(Clone, Debug)]
pub struct HopReport {
    /// The hop's name.
    pub name: &'static str,
    /// The time left when its handler started.
    pub received: Duration,
    /// The header the deadline came from (`None`: the gateway's own budget).
    pub via: Option<DeadlineHeader>,
    /// The hop's own timeout: `received` minus its margin.
    pub own_timeout: Duration,
    /// What it hands the next hop: `received` minus its reserve (`None` for the last hop).
    pub handed: Option<Duration>,
    /// How it ended.
    pub outcome: Outcome,
    /// How long after the handler started it ended.
    pub took: Duration,
}

#[derive(Clone)]
struct Log {
    reports: Arc<watch::Sender<Vec<HopReport>>>,
    print: bool,
}

impl Log {
    fn arrive(&self, report: HopReport) -> usize {
        if self.print {
            let via = report.via.map_or("gateway budget", |h| h.name());
            let handed = report.handed.map_or(String::from("(last hop)"), |d| {
                format!("hands on {:6.1} ms", ms(d))
            });
            println!(
                "  {:<8} received {:6.1} ms ({via}), own timeout {:6.1} ms, {handed}",
                report.name,
                ms(report.received),
                ms(report.own_timeout),
            );
        }
        let mut index = 0;
        self.reports.send_modify(|reports| {
            reports.push(report);
            index = reports.len() - 1;
        });
        index
    }

    fn finish(&self, index: usize, outcome: Outcome, took: Duration) {
        self.reports.send_modify(|reports| {
            if let Some(report) = reports.get_mut(index) {
                report.outcome = outcome;
                report.took = took;
                if self.print {
                    let what = match outcome {
                        Outcome::Answered(status) => format!("answered {status}"),
                        Outcome::OwnTimeout => "gave up at its own timeout, answered 504".into(),
                        Outcome::Cancelled => "cancelled by its deadline: work abandoned".into(),
                        Outcome::Running => "still running".into(),
                    };
                    println!("  {:<8} {what} after {:.1} ms", report.name, ms(took));
                }
            }
        });
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Marks the hop cancelled if its handler is dropped before it finishes.
struct Running {
    log: Log,
    index: usize,
    start: Instant,
    done: bool,
}

impl Running {
    fn finish(mut self, outcome: Outcome) {
        self.done = true;
        self.log.finish(self.index, outcome, self.start.elapsed());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.log
                .finish(self.index, Outcome::Cancelled, self.start.elapsed());
        }
    }
}

struct Next {
    name: &'static str,
    url: String,
    client: PropagateDeadline<HttpClient>,
}

struct Hop {
    spec: HopSpec,
    next: Option<Next>,
    log: Log,
}

async fn handle(
    State(hop): State<Arc<Hop>>,
    Extension(incoming): Extension<IncomingDeadline>,
) -> Response {
    let start = Instant::now();
    let spec = hop.spec;
    let received = incoming.deadline.remaining();
    let own_timeout = received.saturating_sub(spec.own_margin);
    let handed = hop
        .next
        .as_ref()
        .map(|_| received.saturating_sub(spec.reserve.kept_from(received)));
    let index = hop.log.arrive(HopReport {
        name: spec.name,
        received,
        via: incoming.header,
        own_timeout,
        handed,
        outcome: Outcome::Running,
        took: Duration::ZERO,
    });
    let running = Running {
        log: hop.log.clone(),
        index,
        start,
        done: false,
    };
    let work = async {
        tokio::time::sleep(spec.work).await;
        match &hop.next {
            Some(next) => call_next(next).await,
            None => (StatusCode::OK, format!("{} done", spec.name)),
        }
    };
    let (status, body) = if spec.own_margin.is_zero() {
        // The own timeout is the deadline itself, which the deadline layer enforces.
        let (status, body) = work.await;
        running.finish(Outcome::Answered(status));
        (status, body)
    } else {
        match tokio::time::timeout(own_timeout, work).await {
            Ok((status, body)) => {
                running.finish(Outcome::Answered(status));
                (status, body)
            }
            Err(_) => {
                running.finish(Outcome::OwnTimeout);
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("{}: own timeout", spec.name),
                )
            }
        }
    };
    let mut headers = HeaderMap::new();
    if let Ok(name) = HeaderValue::from_str(spec.name) {
        headers.insert(ANSWERED_BY, name);
    }
    (status, headers, body).into_response()
}

/// The status a hop answers with when the next hop answered `downstream` (the table in the
/// [crate docs](crate#what-a-hop-answers-when-the-next-hop-fails)).
///
/// ```
/// use axum::http::StatusCode;
/// use deadline_relay::answer_for;
///
/// assert_eq!(answer_for(StatusCode::NO_CONTENT), StatusCode::OK);
/// assert_eq!(answer_for(StatusCode::GATEWAY_TIMEOUT), StatusCode::GATEWAY_TIMEOUT);
/// assert_eq!(answer_for(StatusCode::SERVICE_UNAVAILABLE), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(answer_for(StatusCode::NOT_FOUND), StatusCode::BAD_GATEWAY);
/// ```
pub fn answer_for(downstream: StatusCode) -> StatusCode {
    match downstream {
        status if status.is_success() => StatusCode::OK,
        StatusCode::GATEWAY_TIMEOUT => StatusCode::GATEWAY_TIMEOUT,
        StatusCode::SERVICE_UNAVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// Calls the next hop and turns its answer, or its failure, into this hop's answer.
async fn call_next(next: &Next) -> (StatusCode, String) {
    let request = match Request::get(&next.url).body(Full::new(Bytes::new())) {
        Ok(request) => request,
        Err(err) => return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    match next.client.clone().oneshot(request).await {
        Ok(response) => {
            let status = response.status();
            let by_a_hop = response.headers().contains_key(ANSWERED_BY);
            let body = match response.into_body().collect().await {
                Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                Err(err) => err.to_string(),
            };
            let answer = answer_for(status);
            if status.is_success() || by_a_hop {
                // A success, or a failure already described by the hop that saw it.
                (answer, body)
            } else {
                let why = format!("{} answered {status}: {}", next.name, body.trim());
                (answer, why)
            }
        }
        Err(err) if err.downcast_ref::<DeadlineTooClose>().is_some() => {
            (StatusCode::GATEWAY_TIMEOUT, err.to_string())
        }
        Err(err) => (
            StatusCode::BAD_GATEWAY,
            format!("{} not reached: {err}", next.name),
        ),
    }
}

/// The client layer of a hop that keeps `reserve`: writes `grpc-timeout` (relative, precise)
/// and `x-request-deadline` (absolute); the receiving hop runs under the earlier of the two.
fn propagate(reserve: Reserve, wall: &WallClock) -> Result<PropagateDeadlineLayer, BoxError> {
    let formats =
        DeadlineHeaders::new(&[DeadlineHeader::GrpcTimeout, DeadlineHeader::RequestDeadline])?;
    Ok(PropagateDeadlineLayer::new()
        .with_reserve(reserve)
        .with_headers(formats)
        .with_wall_clock(wall.clone())
        .validate()?)
}

/// The four hops, serving on 127.0.0.1.
pub struct Relay {
    gateway: SocketAddr,
    log: Log,
}

impl Relay {
    /// Starts the hops (last first, so each knows the next one's address). With `print`, each
    /// hop prints what it received and how it ended.
    ///
    /// The hops' wall clock (for `x-request-deadline`) moves with tokio's clock: the system's
    /// wall time at the start plus tokio's monotonic time since, so all four hops agree to the
    /// nanosecond, as if their hosts' clocks were perfectly in step, and tests under paused
    /// time see exact figures.
    pub async fn start(hops: [HopSpec; 4], print: bool) -> Result<Relay, BoxError> {
        let log = Log {
            reports: Arc::new(watch::Sender::new(Vec::new())),
            print,
        };
        let wall = WallClock::from_clock(Clock::tokio());
        let mut next: Option<Next> = None;
        let mut gateway = None;
        for (position, spec) in hops.iter().enumerate().rev() {
            let deadlines = if position == 0 {
                DeadlineLayer::new().with_default_timeout(ENTRY_BUDGET)
            } else {
                DeadlineLayer::new()
            }
            .with_wall_clock(wall.clone())
            .validate()?;
            let hop = Arc::new(Hop {
                spec: *spec,
                next: next.take(),
                log: log.clone(),
            });
            let router = Router::new()
                .route("/", get(handle))
                .with_state(hop)
                .layer(deadlines);
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            tokio::spawn(async move { axum::serve(listener, router).await });
            // The hop before this one calls it, keeping that hop's reserve.
            if let Some(caller) = position.checked_sub(1).and_then(|i| hops.get(i)) {
                next = Some(Next {
                    name: spec.name,
                    url: format!("http://{addr}/"),
                    client: propagate(caller.reserve, &wall)?.layer(http_client()),
                });
            }
            gateway = Some(addr);
        }
        let gateway = gateway.ok_or("no hops")?;
        Ok(Relay { gateway, log })
    }

    /// The gateway's address.
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Sends one request to the gateway (without a deadline: the gateway's budget applies)
    /// and returns its status, its body and every hop's report, in the order the hops ran.
    pub async fn call(&self) -> Result<(StatusCode, String, Vec<HopReport>), BoxError> {
        self.log.reports.send_modify(Vec::clear);
        let request =
            Request::get(format!("http://{}/", self.gateway)).body(Full::new(Bytes::new()))?;
        let response = http_client().request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let reports = self.log.reports.borrow().clone();
        Ok((status, String::from_utf8_lossy(&body).into_owned(), reports))
    }

    /// The reports of the call in flight, updated as each hop starts and ends: for a caller
    /// that acts when a hop has been reached (a test moving paused time forward).
    pub fn reports(&self) -> watch::Receiver<Vec<HopReport>> {
        self.log.reports.subscribe()
    }
}
