//! `stormguard policy rules list | put | delete --center URL` against a center served in
//! this process on 127.0.0.1 (SQLite in a temporary directory): a rule file is checked before
//! anything is sent (a wrong field exits 2 naming it), stored rule by rule, listed and
//! deleted; a refusal of the center exits 2.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use stormguard_center::{Center, CenterConfig, Role, Store};

const RULES: &str = r#"
[[rules]]
name = "cdn-504"
service = "web"
endpoint = "GET /img/*"
for = "10s"
when = { series = "error_ratio", code = 504, above = 0.1, exit_below = 0.02 }
actions = [{ set = "attempts", max_attempts = 1 }]
"#;

fn stormguard(center: &str, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .arg("policy")
        .args(args)
        .args(["--center", center, "--token", token])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_put_list_delete() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let center = Center::new(Store::open(&url).await.unwrap(), CenterConfig::default())
        .await
        .unwrap();
    let editor = center
        .create_token("alice", Role::Editor, None)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(center.serve(listener, std::future::pending()));

    let good = dir.path().join("rules.toml");
    std::fs::write(&good, RULES).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, RULES.replace("exit_below = 0.02", "exit_below = 0.5")).unwrap();

    let run = move |args: Vec<String>| {
        let (base, editor) = (base.clone(), editor.clone());
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            stormguard(&base, &editor, &args)
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    let (code, _, err) = run(args(&["rules", "put", bad.to_str().unwrap()]))
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rules[0].when.exit_below"), "{err}");
    let (code, out, err) = run(args(&["rules", "put", good.to_str().unwrap()]))
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("stored rule cdn-504 of web"), "{out}");
    let (code, out, _) = run(args(&["rules", "list", "web"])).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.contains("cdn-504") && out.contains("GET /img/*"),
        "{out}"
    );
    let (code, _, _) = run(args(&["rules", "delete", "web", "cdn-504"]))
        .await
        .unwrap();
    assert_eq!(code, 0);
    let (code, _, err) = run(args(&["rules", "delete", "web", "cdn-504"]))
        .await
        .unwrap();
    assert_eq!(code, 2, "a 404 is the center's refusal: {err}");
}
