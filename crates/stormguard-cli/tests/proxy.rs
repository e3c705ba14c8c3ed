//! `stormguard proxy` as a user runs it: bad settings exit 2 naming what is wrong; a good
//! egress serves its admin port until killed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

fn stormguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(args)
        .output()
        .expect("the binary runs")
}

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
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
    let (listen, admin) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(["proxy", "egress", "--policy"])
        .arg(&policy)
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--admin", &format!("127.0.0.1:{admin}"), "--log", "warn"])
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut stream = None;
    for _ in 0..3000 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", admin)) {
            stream = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut stream = stream.expect("the admin port listens");
    write!(stream, "GET /status HTTP/1.0\r\nHost: admin\r\n\r\n").expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.starts_with("HTTP/1.0 200"), "{text}");
    assert!(text.contains("\"direction\":\"egress\""), "{text}");
    assert!(text.contains("GET /*"), "{text}");
}
