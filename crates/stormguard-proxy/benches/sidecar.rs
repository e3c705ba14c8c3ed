//! The sidecar beside HAProxy and nginx, in one run (loopback), built as the sidecar ships
//! (the workspace's `sidecar` profile: release with fat LTO and one codegen unit):
//!
//! ```text
//! cargo bench --profile sidecar -p stormguard-proxy --bench sidecar     # 5 s per load phase
//! cargo bench --profile sidecar -p stormguard-proxy --bench sidecar -- --seconds 10 --rounds 5
//! ```
//!
//! Without `--profile sidecar` it runs on the bench profile (thin local LTO), which costs the
//! proxy about 15 % more user time per request.
//!
//! Needs `haproxy`, `nginx` and `wrk` on PATH (Debian: `apt-get install -y haproxy
//! nginx-light wrk`); a missing one is reported and its rows left out. Processes are pinned
//! with `taskset`: the load generator and the upstream on CPU 0, the proxy under test alone on
//! CPU 1 with one worker thread/process, so "per proxy core" is literal.
//!
//! For each of direct / stormguard / HAProxy / nginx:
//!
//! 1. **max req/s**: `wrk -t1 -c64` for the phase; the proxy's CPU time (utime + stime from
//!    `/proc`) over the phase gives CPU-ms per 1,000 requests; RSS is read after it. The
//!    targets take turns for `--rounds` rounds (3 by default) and the table gives each one's
//!    median: a shared machine's speed drifts within minutes, and one pass over the targets
//!    in a row let that drift decide the ratio between them (each round's figures, and
//!    stormguard's ratio to HAProxy in it, are printed as they come).
//! 2. **latency at a fixed rate** of 50 % of HAProxy's max (this binary's own open-loop
//!    generator, `--role load`, in the manner of wrk2: 64 keep-alive connections, request
//!    *i* scheduled at *i* / rate on the kernel's high-resolution timer, latency measured from
//!    each request's *scheduled* send time, so a stall is not hidden by coordinated
//!    omission): p50, p99, p99.9, and each proxy's
//!    addition over direct. The targets take turns here too, `--rounds` times: the table gives
//!    the median of each percentile, and the median of each round's addition over that
//!    round's direct run (one 5 s run's p99 on two shared cores moved by milliseconds from
//!    run to run).
//! 3. **503s then an outage**: the upstream answers 503 to every 10th request, then to all;
//!    500 GET/s for the phase; upstream requests per client request. Then POSTs without a key
//!    under 10 % 503s: how many the upstream sees per client POST.
//!
//! The retry settings are the issue's: HAProxy `retries 3` + `retry-on 503 conn-failure`;
//! nginx `proxy_next_upstream error timeout http_503` (nginx retries only on *another* server,
//! so the one upstream is listed four times, `proxy_next_upstream_tries 4`: the same 1 + 3);
//! stormguard 4 attempts (the same 1 + 3), jittered backoff, a gRPC-style token budget (10
//! tokens, 0.1 per success).
//!
//! Each role is this binary run again (`--role upstream|stormguard|load`), so one command
//! builds and runs everything. `--stormguard PATH` measures a `stormguard` binary instead of
//! the stormguard role (`PATH proxy egress --workers 1 --log warn`, the same proxy): the
//! sidecar as shipped, built with profile-guided optimisation by `pgo.sh` beside this file.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[path = "sidecar/load.rs"]
mod load;
use load::{LOAD_CONNECTIONS, load};

/// The proxy's policy; `pgo.sh` trains the shipped build with the same file.
const POLICY: &str = include_str!("sidecar/policy.toml");

fn main() -> BoxResult<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    match flag("--role").as_deref() {
        Some("upstream") => upstream(flag("--port").ok_or("--port")?.parse()?),
        Some("stormguard") => stormguard(
            flag("--port").ok_or("--port")?.parse()?,
            flag("--upstream").ok_or("--upstream")?,
            PathBuf::from(flag("--policy").ok_or("--policy")?),
            args.iter().any(|a| a == "--multi"),
        ),
        Some("load") => load(
            flag("--url").ok_or("--url")?,
            flag("--rate").ok_or("--rate")?.parse()?,
            flag("--seconds").ok_or("--seconds")?.parse()?,
            flag("--method").unwrap_or_else(|| "GET".to_owned()),
            flag("--connections").map_or(Ok(LOAD_CONNECTIONS), |c| c.parse())?,
        ),
        Some(other) => Err(format!("unknown role {other}").into()),
        None => orchestrate(
            flag("--seconds").map_or(Ok(5), |s| s.parse())?,
            flag("--rounds").map_or(Ok(3), |r| r.parse())?,
            flag("--stormguard").map(PathBuf::from).as_deref(),
        ),
    }
}

// ---------------------------------------------------------------- upstream role

/// Answers `ok`; every `fail_every`-th request (0: none) gets 503. `/__mode/N` sets N,
/// `/__count` answers "GET POST" counts (control paths are not counted).
fn upstream(port: u16) -> BoxResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let fail_every = Arc::new(AtomicU64::new(0));
        let seq = Arc::new(AtomicU64::new(0));
        let gets = Arc::new(AtomicU64::new(0));
        let posts = Arc::new(AtomicU64::new(0));
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let (fail_every, seq, gets, posts) = (
                Arc::clone(&fail_every),
                Arc::clone(&seq),
                Arc::clone(&gets),
                Arc::clone(&posts),
            );
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let path = req.uri().path().to_owned();
                let (fail_every, seq, gets, posts) = (
                    Arc::clone(&fail_every),
                    Arc::clone(&seq),
                    Arc::clone(&gets),
                    Arc::clone(&posts),
                );
                async move {
                    let ok = |body: String| Response::new(Full::new(Bytes::from(body)));
                    if let Some(n) = path.strip_prefix("/__mode/") {
                        fail_every.store(n.parse().unwrap_or(0), Ordering::SeqCst);
                        seq.store(0, Ordering::SeqCst);
                        gets.store(0, Ordering::SeqCst);
                        posts.store(0, Ordering::SeqCst);
                        return Ok::<_, hyper::Error>(ok(String::new()));
                    }
                    if path == "/__count" {
                        let counts = format!(
                            "{} {}",
                            gets.load(Ordering::SeqCst),
                            posts.load(Ordering::SeqCst)
                        );
                        return Ok(ok(counts));
                    }
                    let is_post = req.method() == http::Method::POST;
                    let _ = req.into_body().collect().await;
                    if is_post { &posts } else { &gets }.fetch_add(1, Ordering::Relaxed);
                    let n = seq.fetch_add(1, Ordering::Relaxed) + 1;
                    let every = fail_every.load(Ordering::Relaxed);
                    if every > 0 && n % every == 0 {
                        let mut r = ok(String::new());
                        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        return Ok(r);
                    }
                    Ok(ok("ok".to_owned()))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

// ---------------------------------------------------------------- stormguard role

/// The egress proxy on one thread (`stormguard proxy --workers 1 --log warn`: tokio's
/// current-thread runtime; `--multi` for the multi-thread runtime with one worker), a fixed
/// upstream and the bench's policy. Its JSON log lines are filtered at `warn`, as the CLI's
/// `--log warn` does: no line per request, like HAProxy and nginx here (no `log` line;
/// `access_log off`).
fn stormguard(port: u16, upstream: String, policy: PathBuf, multi: bool) -> BoxResult<()> {
    if !stormguard_proxy::init_json_logs("warn") {
        return Err("the JSON log subscriber could not be installed".into());
    }
    let runtime = if multi {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let mut proxy = stormguard_proxy::Proxy::start(stormguard_proxy::ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            admin: None,
            upstream: Some(upstream.parse()?),
            direction: stormguard_proxy::Direction::Egress(stormguard_proxy::EgressConfig {
                policy: stormguard_proxy::PolicySource::Watched(policy),
                fault: None,
                seed: None,
            }),
            pool: stormguard_proxy::PoolConfig::default(),
        })
        .await?;
        proxy.wait().await;
        Ok(())
    })
}

// ---------------------------------------------------------------- orchestration

struct Target {
    name: &'static str,
    port: u16,
    child: Option<Child>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // SIGTERM lets nginx's master end its workers (a killed master leaves them
            // running); whatever is left of the family after it exits is killed.
            let pids = family(child.id());
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
            for pid in pids.into_iter().skip(1) {
                let _ = Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

#[derive(Default)]
struct Row {
    max_rps: f64,
    cpu_ms_per_1k: Option<f64>,
    rss_kib: Option<u64>,
    /// One summary of the generator per round.
    latency: Vec<serde_json::Value>,
    partial: Option<f64>,
    outage: Option<f64>,
    post: Option<f64>,
}

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn free_port() -> BoxResult<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn pinned(cpu: &str, program: &Path) -> Command {
    let mut command = Command::new("taskset");
    command.arg("-c").arg(cpu).arg(program);
    command
}

fn wait_listening(port: u16) -> BoxResult<()> {
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("nothing listens on {port}").into())
}

/// One HTTP/1.0 request without a client library (control paths of the upstream).
fn control(port: u16, path: &str) -> BoxResult<String> {
    use std::io::Read as _;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: up\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned())
}

fn counts(up: u16) -> BoxResult<(u64, u64)> {
    let text = control(up, "/__count")?;
    let mut parts = text.split_whitespace().map(str::parse::<u64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(g)), Some(Ok(p))) => Ok((g, p)),
        _ => Err(format!("bad counts {text:?}").into()),
    }
}

/// The process and its children (nginx's workers), by /proc.
fn family(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
        all.extend(family(child));
    }
    all
}

fn cpu_ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn wrk(port: u16, seconds: u64) -> BoxResult<(f64, u64)> {
    let output = Command::new("taskset")
        .args(["-c", "0", "wrk", "-t1", "-c64"])
        .arg(format!("-d{seconds}s"))
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("wrk said: {text}"))?;
    let requests = text
        .lines()
        .find_map(|l| {
            l.split_once(" requests in")
                .map(|(n, _)| n.trim().to_owned())
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Ok((rps, requests))
}

fn generate(
    me: &Path,
    port: u16,
    rate: u64,
    seconds: u64,
    method: &str,
) -> BoxResult<serde_json::Value> {
    let output = pinned("0", me)
        .args(["--role", "load", "--url"])
        .arg(format!("http://127.0.0.1:{port}/item"))
        .args([
            "--rate",
            &rate.to_string(),
            "--seconds",
            &seconds.to_string(),
        ])
        .args(["--method", method])
        .output()?;
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Runs every phase; `cli` is a `stormguard` binary to measure instead of this binary's own
/// stormguard role.
fn orchestrate(seconds: u64, rounds: usize, cli: Option<&Path>) -> BoxResult<()> {
    let me = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("stormguard-sidecar-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load_average.trim());
    for tool in ["taskset", "wrk", "haproxy", "nginx"] {
        if !on_path(tool) {
            println!(
                "MISSING: {tool} (apt-get install -y haproxy nginx-light wrk); its rows are left out"
            );
        }
    }

    let up_port = free_port()?;
    let _upstream = Target {
        name: "upstream",
        port: up_port,
        child: Some(
            pinned("0", &me)
                .args(["--role", "upstream", "--port", &up_port.to_string()])
                .spawn()?,
        ),
    };
    wait_listening(up_port)?;

    let mut targets = vec![Target {
        name: "direct",
        port: up_port,
        child: None,
    }];
    // stormguard
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY)?;
    let port = free_port()?;
    let proxy = match cli {
        // The shipped binary (what `pgo.sh` builds): the same proxy as the role below.
        Some(cli) => {
            if !cli.is_file() {
                return Err(format!(
                    "--stormguard {}: no such file (cargo bench runs the bench in the \
                     package's directory: give an absolute path)",
                    cli.display()
                )
                .into());
            }
            println!("stormguard: {} proxy egress --workers 1", cli.display());
            let mut command = pinned("1", cli);
            command
                .args(["proxy", "egress", "--workers", "1", "--log", "warn"])
                .args(["--drain", "1s", "--listen", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null());
            command
        }
        None => {
            let mut command = pinned("1", &me);
            command.args(["--role", "stormguard", "--port", &port.to_string()]);
            command
        }
    }
    .args(["--upstream", &format!("127.0.0.1:{up_port}")])
    .arg("--policy")
    .arg(&policy)
    .spawn()?;
    targets.push(Target {
        name: "stormguard",
        port,
        child: Some(proxy),
    });
    if on_path("haproxy") {
        let port = free_port()?;
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n  nbthread 1\n  maxconn 4000\n\
                 defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n\
                 \x20 retries 3\n  retry-on 503 conn-failure\n  option http-keep-alive\n  http-reuse always\n\
                 frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
                 backend b\n  server s1 127.0.0.1:{up_port}\n"
            ),
        )?;
        targets.push(Target {
            name: "haproxy",
            port,
            child: Some(
                pinned("1", Path::new("haproxy"))
                    .arg("-db")
                    .arg("-f")
                    .arg(&cfg)
                    .spawn()?,
            ),
        });
    }
    if on_path("nginx") {
        let port = free_port()?;
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(prefix.join("logs"))?;
        let p = prefix.display();
        let servers = (0..4)
            .map(|_| format!("    server 127.0.0.1:{up_port} max_fails=0;\n"))
            .collect::<String>();
        std::fs::write(
            prefix.join("nginx.conf"),
            format!(
                "worker_processes 1;\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log warn;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
                 \x20 fastcgi_temp_path {p}/fcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
                 \x20 upstream up {{\n{servers}    keepalive 256;\n  }}\n\
                 \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
                 \x20     proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
                 \x20     proxy_next_upstream error timeout http_503;\n      proxy_next_upstream_tries 4;\n    }}\n  }}\n}}\n"
            ),
        )?;
        targets.push(Target {
            name: "nginx",
            port,
            child: Some(
                pinned("1", Path::new("nginx"))
                    .arg("-p")
                    .arg(&prefix)
                    .arg("-c")
                    .arg(prefix.join("nginx.conf"))
                    .stderr(Stdio::null())
                    .spawn()?,
            ),
        });
    }
    for t in &targets {
        wait_listening(t.port)?;
    }
    std::thread::sleep(Duration::from_millis(300));

    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    let have_wrk = on_path("wrk");
    // 1. max throughput, CPU, RSS: the targets in turn, `rounds` times; medians.
    let mut maxima: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds.max(1) {
        for t in &targets {
            let pids = t.child.as_ref().map(|c| family(c.id())).unwrap_or_default();
            let before = cpu_ticks(&pids);
            if have_wrk {
                let (rps, requests) = wrk(t.port, seconds)?;
                maxima.entry(t.name).or_default().push(rps);
                if !pids.is_empty() && requests > 0 {
                    let ms = (cpu_ticks(&pids) - before) as f64 * 10.0;
                    cpu.entry(t.name)
                        .or_default()
                        .push(ms / requests as f64 * 1000.0);
                }
            }
            if !pids.is_empty() {
                rows.entry(t.name).or_default().rss_kib = Some(rss_kib(&pids));
            }
            let rps = maxima.get(t.name).and_then(|m| m.last()).unwrap_or(&0.0);
            println!("max: round {round} {} {rps:.0} req/s", t.name);
        }
        let last = |name| maxima.get(name).and_then(|m| m.last()).copied();
        if let (Some(ours), Some(theirs)) = (last("stormguard"), last("haproxy")) {
            println!(
                "max: round {round} stormguard / haproxy {:.2}x",
                ours / theirs
            );
        }
    }
    for t in &targets {
        let row = rows.entry(t.name).or_default();
        row.max_rps = maxima.get(t.name).map_or(0.0, |m| median(m));
        row.cpu_ms_per_1k = cpu.get(t.name).map(|c| median(c));
    }
    // 2. latency at 50 % of HAProxy's max (or of the direct max without HAProxy)
    let reference = rows
        .get("haproxy")
        .or_else(|| rows.get("direct"))
        .map_or(1000.0, |r| r.max_rps);
    let rate = ((reference * 0.5) as u64).max(100);
    println!("fixed rate: {rate} req/s");
    for round in 1..=rounds.max(1) {
        for t in &targets {
            let summary = generate(&me, t.port, rate, seconds, "GET")?;
            println!("latency: round {round} {} {summary}", t.name);
            rows.entry(t.name).or_default().latency.push(summary);
        }
    }
    // 3. 10 % 503s, an outage, unkeyed POSTs under 10 % 503s
    for t in targets.iter().filter(|t| t.name != "direct") {
        let row = rows.entry(t.name).or_default();
        let ratio = |mode: u64, method: &str| -> BoxResult<f64> {
            control(up_port, &format!("/__mode/{mode}"))?;
            let summary = generate(&me, t.port, 500, seconds.min(4), method)?;
            let sent = summary["sent"].as_f64().unwrap_or(1.0);
            let (gets, posts) = counts(up_port)?;
            let seen = if method == "POST" { posts } else { gets };
            Ok(seen as f64 / sent)
        };
        row.partial = Some(ratio(10, "GET")?);
        row.outage = Some(ratio(1, "GET")?);
        row.post = Some(ratio(10, "POST")?);
        control(up_port, "/__mode/0")?;
        println!(
            "failures: {} 10%503 {:.3}x outage {:.3}x unkeyed POST {:.3}x",
            t.name,
            row.partial.unwrap_or(0.0),
            row.outage.unwrap_or(0.0),
            row.post.unwrap_or(0.0)
        );
    }

    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nload average at end: {}", load_average.trim());
    let direct: &[serde_json::Value] = rows.get("direct").map_or(&[], |r| &r.latency);
    // The median of a percentile over the rounds, and the median of its per-round addition
    // over direct (rounds paired in order: each ran on the same machine state).
    let added = |row: &Row, key: &str| -> String {
        let value = |summary: &serde_json::Value| summary[key].as_f64().unwrap_or(0.0);
        if row.latency.is_empty() {
            return "-".to_owned();
        }
        let own: Vec<f64> = row.latency.iter().map(value).collect();
        let over: Vec<f64> = row
            .latency
            .iter()
            .zip(direct)
            .map(|(l, d)| value(l) - value(d))
            .collect();
        if over.is_empty() {
            return format!("{:.0}", median(&own));
        }
        format!("{:.0} ({:+.0})", median(&own), median(&over))
    };
    println!(
        "\n| target | max req/s (1 core) | p50 µs | p99 µs | p99.9 µs | CPU-ms / 1k req | RSS KiB | upstream req per client req: 10 % 503 | outage | unkeyed POST under 10 % 503 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for t in &targets {
        let Some(row) = rows.get(t.name) else {
            continue;
        };
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.name,
            row.max_rps,
            added(row, "p50_us"),
            added(row, "p99_us"),
            added(row, "p999_us"),
            opt(row.cpu_ms_per_1k, 1),
            row.rss_kib.map_or("-".to_owned(), |v| v.to_string()),
            opt(row.partial, 3),
            opt(row.outage, 3),
            opt(row.post, 3),
        );
    }
    println!(
        "\nmedians of {rounds} rounds; fixed rate {rate} req/s for {seconds} s per round; in parentheses the median of each round's latency added over direct"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
