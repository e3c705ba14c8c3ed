//! The cost of live policies: a call through the stack with and without a file watcher, and
//! with a time window (one wall-clock read per call to see whether an edge passed)
//! (criterion), and the reload latency from a file's rename to the new policy in use
//! (printed: median and worst of 50 reloads, at two debounce times).
//!
//! ```text
//! cargo bench -p stormguard-tower --features watch --bench policy_reload
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayer;
use tower::{Layer, ServiceExt, service_fn};

fn policy(per_try_ms: u64) -> String {
    format!(
        "[endpoints.\"GET /x\"]\nidempotency = \"idempotent\"\n\
         timeouts = {{ per_try = \"{per_try_ms}ms\" }}\nretry = {{ max_attempts = 3 }}\n\
         budget = {{ kind = \"grpc\", max_tokens = 10, token_ratio = 0.1 }}\n\
         breaker = {{ count = 100, minimum_throughput = 10 }}\n"
    )
}

fn replace(path: &Path, text: &str) {
    let temp = path.with_extension("toml.tmp");
    std::fs::write(&temp, text).expect("write");
    std::fs::rename(&temp, path).expect("rename");
}

fn request_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("stormguard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("policies.toml");
    replace(&path, &policy(200));
    let file = PolicyFile::load(&path).expect("valid");
    let downstream = service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
    });
    // The same policy with a daily window: the stack reads the wall clock on every call.
    let windowed = PolicyFile::from_toml(&format!(
        "{}\n[[endpoints.\"GET /x\".windows]]\nstart = \"03:00\"\nend = \"04:00\"\n\
         time_zone = \"Asia/Shanghai\"\noverrides = {{ timeouts = {{ per_try = \"2s\" }} }}\n",
        policy(200)
    ))
    .expect("valid");
    let mut group = c.benchmark_group("call");
    {
        let client = ClientLayer::from_policy_file(&windowed)
            .expect("stack")
            .layer(downstream);
        group.bench_function("with_time_window", |b| {
            b.to_async(&runtime).iter(|| {
                let request = Request::get("http://svc/x")
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                client.clone().oneshot(request)
            });
        });
    }
    for watched in [false, true] {
        let layer = ClientLayer::from_policy_file(&file).expect("stack");
        let watcher = watched.then(|| {
            layer
                .policies()
                .watch(&path, Duration::from_millis(10))
                .expect("watch")
        });
        let client = layer.layer(downstream);
        let name = if watched {
            "with_watcher"
        } else {
            "without_watcher"
        };
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| {
                let request = Request::get("http://svc/x")
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                client.clone().oneshot(request)
            });
        });
        drop(watcher);
    }
    group.finish();

    for debounce_ms in [10, 100] {
        let layer = ClientLayer::from_policy_file(&file).expect("stack");
        let policies = layer.policies().clone();
        let _watcher = policies
            .watch(&path, Duration::from_millis(debounce_ms))
            .expect("watch");
        let mut latencies = Vec::new();
        for i in 0..50 {
            let before = policies.version();
            let start = Instant::now();
            replace(&path, &policy(if i % 2 == 0 { 300 } else { 200 }));
            while policies.version() == before {
                std::thread::sleep(Duration::from_micros(100));
            }
            latencies.push(start.elapsed());
        }
        latencies.sort();
        println!(
            "reload latency, debounce {debounce_ms} ms: median {:.1} ms, worst {:.1} ms (50 reloads, rename to new policy in use)",
            latencies[25].as_secs_f64() * 1e3,
            latencies[49].as_secs_f64() * 1e3
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

criterion_group!(benches, request_path);
criterion_main!(benches);
