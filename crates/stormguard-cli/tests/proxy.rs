//! `stormguard proxy` as a user runs it: bad settings exit 2 naming what is wrong; a good
//! egress serves its admin port until killed.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "support/run.rs"]
mod run;
use run::stormguard;

#[test]
fn bad_settings_exit_2_and_say_what_is_wrong() {
    let dir = std::env::temp_dir();
    let missing = dir.join("stormguard-proxy-no-such-policy.toml");
    let missing = missing.to_str().expect("utf-8");
    let cases: &[(&[&str], &str)] = &[
        (&["proxy", "egress", "--policy", missing], "policy file"),
        (&["proxy", "ingress", "--upstream", "nohost"], "--upstream"),
        (
            &["proxy", "ingress", "--upstream", "https://a:1"],
            "--upstream",
        ),
        (
            &[
                "proxy",
                "egress",
                "--policy",
                "p.toml",
                "--fault-abort",
                "2:503",
            ],
            "--fault-abort",
        ),
        (
            &[
                "proxy",
                "egress",
                "--policy",
                "p.toml",
                "--fault-delay",
                "0.1:soon",
            ],
            "--fault-delay",
        ),
        (
            &["proxy", "ingress", "--upstream", "a:1", "--limit", "magic"],
            "--limit",
        ),
        (
            &[
                "proxy",
                "ingress",
                "--upstream",
                "a:1",
                "--idempotency",
                "mongo://x",
            ],
            "--idempotency",
        ),
        (
            &["proxy", "ingress", "--upstream", "a:1", "--workers", "0"],
            "--workers",
        ),
        (
            &[
                "proxy",
                "ingress",
                "--upstream",
                "a:1",
                "--connect-timeout",
                "0s",
            ],
            "connect_timeout",
        ),
        (
            &[
                "proxy",
                "egress",
                "--policy",
                "p.toml",
                "--idle-timeout",
                "2h",
            ],
            "idle_timeout",
        ),
        (&["proxy", "egress"], "--policy"),
        (
            &["proxy", "egress", "--center", "http://center:7450"],
            "--center-token",
        ),
        (
            &[
                "proxy", "egress", "--policy", "p.toml", "--admin", "nowhere",
            ],
            "--admin",
        ),
    ];
    for (args, named) in cases {
        let output = stormguard(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
    }
}

/// The addresses a proxy prints on its first line of stdout: `{"listen": …, "admin": …}`.
struct Started {
    child: std::process::Child,
    listen: std::net::SocketAddr,
    admin: Option<std::net::SocketAddr>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `stormguard` with `args` and reads the addresses it bound from its first line of
/// stdout (a proxy asked for port 0 gets its ports from the kernel: no race for a free port,
/// no polling). A child that exits first, or says nothing for 60 s, fails the test.
fn start(args: &[&std::ffi::OsStr]) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the proxy prints its addresses");
    let started: serde_json::Value = match serde_json::from_str(&line) {
        Ok(value) => value,
        Err(e) => {
            let _ = child.kill();
            panic!("the first line is not the addresses ({e}): {line:?}");
        }
    };
    let addr = |key: &str| {
        started[key]
            .as_str()
            .map(|a| a.parse().expect("an address"))
    };
    Started {
        listen: addr("listen").expect("the listen address"),
        admin: addr("admin"),
        child,
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    text
}

#[test]
fn an_egress_serves_its_admin_port() {
    let dir = std::env::temp_dir().join(format!("stormguard-cli-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let policy = dir.join("policies.toml");
    std::fs::write(
        &policy,
        "[endpoints.\"GET /*\"]\nretry = { max_attempts = 2 }\n",
    )
    .expect("write");
    let proxy = start(&[
        "proxy".as_ref(),
        "egress".as_ref(),
        "--policy".as_ref(),
        policy.as_os_str(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--admin".as_ref(),
        "0".as_ref(),
        "--log".as_ref(),
        "warn".as_ref(),
    ]);
    assert_ne!(proxy.listen.port(), 0, "the bound port is printed");
    let admin = proxy.admin.expect("an admin address");
    assert!(
        admin.ip().is_loopback(),
        "a bare admin port binds loopback: {admin}"
    );

    let text = get(admin, "/status");
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);

    assert!(text.starts_with("HTTP/1.0 200"), "{text}");
    assert!(text.contains("\"direction\":\"egress\""), "{text}");
    assert!(text.contains("GET /*"), "{text}");
}
