//! Loads a 10 MB policy file (TOML, then the same policies as JSON) and prints the time and
//! the peak resident memory of each load, to check the issue 12 target: peak RSS at most ten
//! times the file's size. Each load runs in a child process of its own, so that its peak is
//! its own.
//!
//! ```text
//! cargo run --release -p stormguard --example policy_load [-- MEGABYTES]
//! ```
//!
//! Linux only for the memory figure (it reads `VmHWM` from `/proc/self/status`).

use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

use stormguard::policy::PolicyFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    if let (Some(mode), Some(path)) = (args.next(), args.next()) {
        if mode == "load" {
            return load(&path);
        }
    }
    let megabytes: usize = std::env::args().nth(1).map_or(Ok(10), |a| a.parse())?;
    let dir = std::env::temp_dir().join(format!("stormguard-policy-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let toml_path = dir.join("policies.toml");
    let json_path = dir.join("policies.json");
    let mut text = String::new();
    let mut endpoints = 0;
    while text.len() < megabytes << 20 {
        let _ = write!(
            text,
            "[endpoints.\"POST /v1/r{endpoints}/*\"]\nidempotency = \"idempotent\"\n\
             timeouts = {{ per_try = \"300ms\", overall = \"1s\" }}\nretry = {{ max_attempts = 3 }}\n\
             budget = {{ kind = \"grpc\", max_tokens = 10, token_ratio = 0.1 }}\n\n"
        );
        endpoints += 1;
    }
    std::fs::write(&toml_path, &text)?;
    // The same policies as compact JSON, about the same size.
    let mut json = String::from("{\"endpoints\":{");
    for i in 0..endpoints {
        let _ = write!(
            json,
            "{}\"POST /v1/r{i}/*\":{{\"idempotency\":\"idempotent\",\"timeouts\":{{\"per_try\":\"300ms\",\"overall\":\"1s\"}},\"retry\":{{\"max_attempts\":3}},\"budget\":{{\"kind\":\"grpc\",\"max_tokens\":10,\"token_ratio\":0.1}}}}",
            if i == 0 { "" } else { "," }
        );
    }
    json.push_str("}}");
    std::fs::write(&json_path, json)?;
    println!("{endpoints} endpoints");
    for path in [&toml_path, &json_path] {
        let status = Command::new(std::env::current_exe()?)
            .arg("load")
            .arg(path)
            .status()?;
        assert!(status.success());
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn load(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let size = std::fs::metadata(path)?.len();
    let before = peak_kib();
    let start = Instant::now();
    let file = PolicyFile::load(path)?;
    let elapsed = start.elapsed();
    let peak = peak_kib();
    println!(
        "{path}: {:.1} MB, {} endpoints: loaded in {:.0} ms; peak RSS {:.1} MB ({:.1} MB before the load) = {:.1}x the file",
        size as f64 / 1e6,
        file.endpoints().len(),
        elapsed.as_secs_f64() * 1e3,
        peak as f64 * 1024.0 / 1e6,
        before as f64 * 1024.0 / 1e6,
        peak as f64 * 1024.0 / size as f64,
    );
    Ok(())
}

/// The peak resident set size of this process, in KiB (0 where `/proc` has none).
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
