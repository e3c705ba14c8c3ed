//! The four scenarios of the harness, each a function of the run's context that returns what
//! it saw; `conclude` in the parent module judges them.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use super::{Ctx, HarnessError, Ran, burst, io, ratio, send_all};
use crate::callback::PaymentCallback;
use crate::launcher::ChildService;
use crate::platform::Answer;
use crate::policy::Policies;
use crate::proxy::{FaultProxy, ProxyFaults};
use crate::service::Service;

pub(super) async fn duplicates(ctx: &Ctx<'_>) -> Result<Ran, HarnessError> {
    let service = Service::start(ctx.service_config()?).await?;
    let platform = ctx.platform(service.addr())?;
    let cb = PaymentCallback::paid(format!("{}1", ctx.prefix), "WX1", 1250);
    let n = ctx.sizes.duplicates;
    let concurrent = n / 2;
    let window = Duration::from_secs(60).div_f64(ctx.config.time_scale.max(1.0));
    let step = window.div_f64((n - concurrent).max(1) as f64);
    let plan = (0..n)
        .map(|i| {
            let at = match i.checked_sub(concurrent) {
                None => Duration::ZERO,
                Some(k) => step * u32::try_from(k).unwrap_or(u32::MAX),
            };
            (at, cb.clone())
        })
        .collect();
    let (notifications, delivered) = send_all(&platform, plan).await;
    let counts = ctx.drained(1).await;
    service.stop().await;
    let (counts, broker) = counts?;
    Ok(Ran {
        platform,
        orders: 1,
        notifications,
        delivered,
        counts,
        broker,
        notes: vec![format!(
            "{n} deliveries of one callback within {} ms, {concurrent} of them at once",
            window.as_millis()
        )],
        violations: Vec::new(),
    })
}

pub(super) async fn crash(ctx: &Ctx<'_>) -> Result<Ran, HarnessError> {
    let launcher = ctx
        .config
        .launcher
        .as_ref()
        .ok_or(HarnessError::NoLauncher)?;
    let args = |listen: SocketAddr| -> Vec<OsString> {
        [
            "--listen".to_owned(),
            listen.to_string(),
            "--database-url".to_owned(),
            ctx.env.url.to_string(),
            "--risk-url".to_owned(),
            ctx.risk.url(),
            "--broker".to_owned(),
            ctx.config.broker.to_string(),
            "--seed".to_owned(),
            ctx.config.seed.to_string(),
            "--bind-patience".to_owned(),
            "10s".to_owned(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    };
    let log = ctx.config.log_file.as_deref();
    let first = launcher
        .spawn(args(SocketAddr::from(([127, 0, 0, 1], 0))), log)
        .await?;
    let addr = first.addr();
    let platform = ctx.platform(addr)?;
    let burst_window = ctx.sizes.crash_burst;
    let orders = ctx.sizes.crash_orders;
    let plan = burst(&ctx.prefix, orders, 3, burst_window);
    let sender = {
        let platform = platform.clone();
        tokio::spawn(async move { send_all(&platform, plan).await })
    };
    // Kill mid-burst; restart on the same port after a pause.
    tokio::time::sleep(burst_window / 2).await;
    let before = platform.stats();
    let in_flight = platform.in_flight();
    let pid = first.id();
    first.kill().map_err(io("killing the service process"))?;
    let killed_at = platform.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second: ChildService = launcher.spawn(args(addr), log).await?;
    let note = format!(
        "SIGKILL of pid {pid} at {} ms with {in_flight} deliveries in flight, after {} answered ({} success); restarted as pid {} at {} ms",
        killed_at.as_millis(),
        before.deliveries,
        before.successes,
        second.id(),
        platform.elapsed().as_millis()
    );
    let (notifications, delivered) = sender.await.unwrap_or((0, 0));
    let counts = ctx.drained(orders as i64).await;
    let _ = second.kill();
    let (counts, broker) = counts?;
    Ok(Ran {
        platform,
        orders: orders as i64,
        notifications,
        delivered,
        counts,
        broker,
        notes: vec![note],
        violations: Vec::new(),
    })
}

pub(super) async fn network_faults(ctx: &Ctx<'_>) -> Result<Ran, HarnessError> {
    let service = Service::start(ctx.service_config()?).await?;
    let proxy = FaultProxy::start(
        service.addr(),
        ProxyFaults {
            reset: 0.05,
            drop_answer: 0.10,
        },
        ctx.config.seed ^ 0xfa17,
    )
    .await
    .map_err(io("starting the fault proxy"))?;
    let platform = ctx.platform(proxy.addr())?;
    let orders = ctx.sizes.network_orders;
    let plan = burst(&ctx.prefix, orders, 4, ctx.sizes.network_window);
    let (notifications, delivered) = send_all(&platform, plan).await;
    let counts = ctx.drained(orders as i64).await;
    let p = proxy.counts();
    proxy.stop().await;
    service.stop().await;
    let mut violations = Vec::new();
    if p.resets == 0 || p.dropped_answers == 0 {
        violations.push("the proxy injected no reset or no dropped answer".to_owned());
    }
    let (counts, broker) = counts?;
    Ok(Ran {
        platform,
        orders: orders as i64,
        notifications,
        delivered,
        counts,
        broker,
        notes: vec![format!(
            "proxy: {} connections, {} reset, {} answers dropped after the service answered",
            p.connections, p.resets, p.dropped_answers
        )],
        violations,
    })
}

pub(super) async fn risk_down(ctx: &Ctx<'_>) -> Result<Ran, HarnessError> {
    let headroom = Policies::default_policies()?
        .risk_budget_headroom()
        .unwrap_or(0);
    let service = Service::start(ctx.service_config()?).await?;
    let platform = ctx.platform(service.addr())?;
    let orders = ctx.sizes.down_orders;
    let plan = burst(&ctx.prefix, orders, 0, ctx.sizes.down_window);
    let sender = {
        let platform = platform.clone();
        tokio::spawn(async move { send_all(&platform, plan).await })
    };
    tokio::time::sleep(ctx.sizes.down_from.saturating_sub(platform.elapsed())).await;
    ctx.faults.set_down(true);
    let down_start = platform.elapsed();
    tokio::time::sleep(ctx.sizes.down_for).await;
    ctx.faults.set_down(false);
    let down_end = platform.elapsed();
    let (notifications, delivered) = sender.await.unwrap_or((0, 0));
    let counts = ctx.drained(orders as i64).await;
    service.stop().await;

    let r = ctx.faults.counts();
    let first_while_down = r.requests_while_down - r.retries_while_down;
    let inside: Vec<_> = platform
        .deliveries()
        .into_iter()
        .filter(|d| d.sent >= down_start && d.sent + d.latency <= down_end)
        .collect();
    let failed_inside = inside
        .iter()
        .filter(|d| d.answer != Answer::Success)
        .count();
    let marked_inside = inside
        .iter()
        .filter(|d| {
            d.answer
                == Answer::Http {
                    status: 500,
                    retry_exhausted: true,
                }
        })
        .count();
    let mut violations = Vec::new();
    if inside.is_empty() {
        violations.push("no delivery was answered inside the outage".to_owned());
    }
    if marked_inside != inside.len() {
        violations.push(format!(
            "inside the outage {} of {} answers were not 500 + X-Retry-Exhausted",
            inside.len() - marked_inside,
            inside.len()
        ));
    }
    let bound = headroom + r.peak_in_flight_while_down;
    if r.retries_while_down > bound {
        violations.push(format!(
            "{} retries while down exceed the budget's headroom {headroom} plus {} in flight",
            r.retries_while_down, r.peak_in_flight_while_down
        ));
    }
    let (counts, broker) = counts?;
    Ok(Ran {
        platform,
        orders: orders as i64,
        notifications,
        delivered,
        counts,
        broker,
        notes: vec![
            format!(
                "risk down {}–{} ms: {} requests = {} checks + {} retries (bound: budget headroom {headroom} + {} in flight) → {:.2} attempts per check (3.00 without a budget)",
                down_start.as_millis(),
                down_end.as_millis(),
                r.requests_while_down,
                first_while_down,
                r.retries_while_down,
                r.peak_in_flight_while_down,
                ratio(r.requests_while_down, first_while_down),
            ),
            format!(
                "{} deliveries answered inside the outage: {failed_inside} failed, {marked_inside} with 500 + X-Retry-Exhausted",
                inside.len()
            ),
        ],
        violations,
    })
}
