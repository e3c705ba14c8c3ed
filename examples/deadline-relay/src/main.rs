//! `deadline-relay`: the seeds' budget table (gateway 1000 ms → A 900 → B 600 → C 300), live
//! over HTTP on 127.0.0.1, then the same chain with a C too slow for its 300 ms.
//!
//! ```sh
//! cargo run -p deadline-relay
//! ```

use std::time::Duration;

use deadline_relay::{HopReport, Relay, seeds_hops};
use stormguard_tower::wire::BoxError;

/// The seeds' table: received, own timeout, handed downstream (ms).
const SEEDS: [(&str, u32, u32, Option<u32>); 4] = [
    ("gateway", 1000, 950, Some(900)),
    ("A", 900, 800, Some(600)),
    ("B", 600, 450, Some(300)),
    ("C", 300, 300, None),
];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!("1. C's work takes 20 ms: every hop gets its share of the gateway's 1000 ms");
    let relay = Relay::start(seeds_hops(Duration::from_millis(20)), true).await?;
    let (status, body, reports) = relay.call().await?;
    println!("  caller   got {status}: {body}\n");
    table(&reports);

    println!("\n2. C's work takes 400 ms, more than the 300 ms it was handed");
    let relay = Relay::start(seeds_hops(Duration::from_millis(400)), true).await?;
    let (status, body, _) = relay.call().await?;
    println!("  caller   got {status}: {body}");
    println!(
        "\nC is stopped when its 300 ms are up instead of finishing work nobody waits for, and\n\
         every hop above it answers in time."
    );
    Ok(())
}

fn table(reports: &[HopReport]) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!(
        "  {:<8} {:>10} {:>12} {:>16}   seeds: received / own timeout / hands on",
        "hop", "received", "own timeout", "hands on"
    );
    for (report, (name, received, own, hands)) in reports.iter().zip(SEEDS) {
        debug_assert_eq!(report.name, name);
        let handed = report.handed.map_or("-".to_owned(), ms);
        let seeds_hands = hands.map_or("-".to_owned(), |h| h.to_string());
        println!(
            "  {:<8} {:>10} {:>12} {:>16}   {received} / {own} / {seeds_hands}",
            report.name,
            ms(report.received),
            ms(report.own_timeout),
            handed,
        );
    }
}
