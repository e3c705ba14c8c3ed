//! The whole story under tokio's paused clock: the real center, servers and client stacks
//! on 127.0.0.1, with the 70 s of the demo compressed into the time the work takes.
//!
//! Paused time advances only when every task waits on a timer, so the sockets' traffic
//! happens at the instant it was sent and the instants in the record are those of the
//! schedule. One caveat: sqlx runs SQLite on a thread of its own, and while the runtime
//! waits for it with nothing else to do, the paused clock jumps to the next timer (with
//! nothing else scheduled, to the pool's 5 s acquire timeout, which then fails the query).
//! So the set-up, which opens the store, runs in real time and the clock is paused after
//! it; and during the story a pacer task keeps a timer a millisecond away, so the clock
//! moves a millisecond at a time while the runtime waits for SQLite. It still moves while
//! SQLite works, so the virtual instants depend a little on how fast SQLite answered: in
//! ten runs on a loaded machine the switch took 3.0 to 3.5 s of virtual time. The
//! assertions hold with far more slack than that (the goal is 10 s).

use std::time::Duration;

use stormguard::policy::{Fallback, PolicyFile};

use super::report::{self, SWITCH_GOAL};
use super::scenario::{Config, Run, World};
use super::timeline::{Answer, Mark};

/// Plays `world`'s story under the paused clock, with the pacer. The world was started in
/// real time (opening the SQLite store waits on its thread); the clock stays paused after.
pub(super) async fn play_paused(world: &mut World) -> Run {
    tokio::time::pause();
    // The pacer: a timer every millisecond, so that while the runtime waits on SQLite's
    // thread the paused clock moves a millisecond at a time, not to the next far timer.
    let pacer = tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let run = world.play().await.expect("the run");
    pacer.abort();
    run
}

#[tokio::test]
async fn the_cdn_outage_heals_itself_and_reverts_under_compressed_time() {
    let config = Config::default();
    let mut world = World::start(&config).await.expect("the set-up");
    let run = play_paused(&mut world).await;
    let (bins, s) = report::read(&run);
    let r = &run.record;
    // What the demo prints, for whoever reads the test's output (`--nocapture`).
    println!("{}", report::table(&bins, &s));

    // The rule fired once and reverted once: three versions, two by the rule.
    let authors: Vec<_> = run.versions.iter().map(|v| v.author.as_str()).collect();
    assert_eq!(
        authors,
        ["ops", "rule:cdn-failing", "rule:cdn-failing"],
        "{s:#?}"
    );
    let fired = s.fired.as_ref().expect("the rule fired");
    let reverted = s.reverted.as_ref().expect("the rule reverted");
    let policy = |n: usize| PolicyFile::from_toml(&run.versions[n].policy).expect("a policy");
    let endpoint = |file: &PolicyFile| file.endpoint("GET /img/*").cloned().expect("endpoint");
    let (base, switched, back) = (
        endpoint(&policy(0)),
        endpoint(&policy(1)),
        endpoint(&policy(2)),
    );

    // Retries 3 -> 0 and the switch to the backup source, in the published policy...
    assert_eq!(base.retry().max_attempts(), 4);
    assert_eq!(base.fallback(), Fallback::Never);
    assert_eq!(switched.retry().max_attempts(), 1);
    assert_eq!(switched.fallback(), Fallback::OnGiveUp);
    // ...and in what the clients did: 4 attempts per failing request before, 1 after
    // (every request's attempts reached the record, by its x-request-id).
    assert!(r.requests.iter().all(|q| q.attempts >= 1));
    assert_eq!(s.max_attempts_before, 4, "{s:#?}");
    assert_eq!(s.max_attempts_switched, 1, "{s:#?}");

    // The switch: from the first 504 to every client running the fired version.
    let first_504 = s.first_504_s.expect("the CDN answered 504");
    let outage = config.outage_at.as_secs_f64();
    assert!(first_504 >= outage && first_504 < outage + 0.5, "{s:#?}");
    let switch = s.switch_s.expect("every client switched");
    assert!(
        switch <= SWITCH_GOAL.as_secs_f64(),
        "switch took {switch} s: {s:#?}"
    );
    assert!(s.within_goal);

    // Users saw errors during the outage only until the switch, none after it...
    assert!(s.errors > 0, "the outage was visible before the switch");
    assert_eq!(s.errors_after_switch, 0, "{s:#?}");
    let switched_at = fired.all_applied_s.expect("all applied");
    let last_error = s.last_error_s.expect("errors happened");
    assert!(
        last_error >= first_504 && last_error <= switched_at,
        "{s:#?}"
    );
    // ...because every request started on the fired version during the outage was
    // answered by the backup source.
    let recovered = s.recovered_at_s.expect("the CDN recovered");
    let on_backup = r
        .requests
        .iter()
        .filter(|q| q.version == Some(fired.version))
        .filter(|q| q.at.as_secs_f64() < recovered - 0.5)
        .collect::<Vec<_>>();
    assert!(!on_backup.is_empty());
    assert!(on_backup.iter().all(|q| q.answer == Answer::Backup));

    // The revert came after the CDN recovered and restored the first policy's values.
    let back_at = reverted.first_applied_s.expect("the revert was applied");
    assert!(back_at > recovered, "{s:#?}");
    assert!(reverted.all_applied_s.is_some());
    assert_eq!(back.retry().max_attempts(), 4);
    assert_eq!(back.fallback(), Fallback::Never);
    // After it, the CDN answers again, with no errors and no backup.
    let after: Vec<_> = r
        .requests
        .iter()
        .filter(|q| q.version == Some(reverted.version))
        .collect();
    assert!(!after.is_empty());
    assert!(after.iter().all(|q| q.answer == Answer::Cdn));

    // The bins say the same: errors in the outage's first seconds only, the version steps.
    let errors_at: Vec<_> = bins.iter().filter(|b| b.errors > 0).map(|b| b.t).collect();
    assert!(
        errors_at
            .iter()
            .all(|t| *t >= outage.floor() && *t <= switched_at),
        "{errors_at:?}"
    );
    assert_eq!(
        bins.last().and_then(|b| b.version_min),
        Some(reverted.version)
    );
    assert_eq!(report::verdict(&s), Ok(()));
    let figure = crate::plot::self_heal(&bins, &s);
    assert_eq!(figure.panels.len(), 3);
    assert!(
        figure.title.contains("every client switched in"),
        "{}",
        figure.title
    );
    assert!(r.marks.iter().any(|(_, m)| *m == Mark::CdnRecovered));
}

#[test]
fn a_run_that_cannot_tell_the_story_is_refused_naming_the_flag() {
    let bad = |f: fn(&mut Config)| {
        let mut config = Config::default();
        f(&mut config);
        config.validate().expect_err("refused")
    };
    assert!(bad(|c| c.clients = 0).contains("--clients"));
    assert!(bad(|c| c.rate = f64::NAN).contains("--rate"));
    assert!(bad(|c| c.outage_for = Duration::ZERO).contains("--outage-for"));
    assert!(bad(|c| c.duration = Duration::from_secs(30)).contains("--duration"));
    let rules = bad(|c| c.rules = "[[rules]]\nname = 1".to_owned());
    assert!(
        rules.starts_with("--rules:") && rules.contains("name"),
        "{rules}"
    );
    assert!(bad(|c| c.policy = "x = ".to_owned()).contains("--policy"));
    assert_eq!(Config::default().validate(), Ok(()));
}
