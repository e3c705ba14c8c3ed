//! The conformance suite: every numbered behaviour of issue 6 (`suite.rs`), of issue 18
//! (`hardening.rs`) and of our own client in front of the server (`client.rs`), on every
//! store.
//!
//! Each file holds one `async fn` per behaviour, each taking a fresh isolated [`TestEnv`];
//! the macro below instantiates all of them for each store. Networked stores read
//! `STORMGUARD_TEST_POSTGRES_URL`, `STORMGUARD_TEST_MYSQL_URL` and `STORMGUARD_TEST_REDIS_URL`
//! and print `SKIPPED: ...` to stderr when theirs is not set.

mod client;
mod hardening;
mod suite;
#[path = "../support/mod.rs"]
mod support;

use support::Backend;

macro_rules! conformance {
    ($($store:ident => $backend:expr),* $(,)?) => {
        $(
            mod $store {
                use super::*;
                conformance!(@tests $backend;
                    b01_missing_key_is_400,
                    b02_malformed_key_is_400,
                    b03_first_runs_duplicate_replays_byte_for_byte,
                    b04_in_flight_duplicate_is_409,
                    b04_in_flight_duplicate_can_wait_for_the_result,
                    b05_other_fingerprint_is_422,
                    b06_tenants_are_isolated,
                    b07_crashed_holder_lease_expires_and_a_retry_takes_over,
                    b07_stale_holder_cannot_complete,
                    b07_store_level_fencing,
                    b08_refusals_before_the_handler_are_not_stored,
                    b08_stored_statuses_are_configurable,
                    b09_keys_expire_after_retention,
                    b09_reaper_is_bounded_per_pass,
                    b10_store_failure_fails_closed,
                    b10_fail_open_is_explicit,
                    b11_oversized_response_is_marked_not_truncated,
                    b11_oversized_response_can_release_the_key,
                    b12_two_hundred_concurrent_duplicates_run_once,
                    b12_thousand_sequential_duplicates_run_once,
                );
                conformance!(@tests_in client, $backend;
                    c01_a_keyed_retry_after_a_timeout_gets_the_stored_answer,
                );
                conformance!(@tests_in hardening, $backend;
                    h01_a_tenant_spelling_a_hash_gets_its_own_scope,
                    h02_json_numbers_keep_every_digit,
                    h03_the_lease_follows_the_current_deadline,
                    h03_the_lease_follows_a_deadline_header,
                    h08_replays_keep_the_handlers_headers,
                    h09_complete_fails_after_the_handler_ran,
                    h09_store_hangs_after_the_handler_ran,
                    h09_store_hangs_at_begin,
                    h09_release_fails_after_the_handler_ran,
                    h09_a_corrupt_record_fails_closed,
                    h09_a_failing_response_body_is_not_run_again,
                    h09_a_transient_complete_failure_is_retried,
                );
            }
        )*
    };
    (@tests $backend:expr; $($test:ident),* $(,)?) => {
        conformance!(@tests_in suite, $backend; $($test),*);
    };
    (@tests_in $file:ident, $backend:expr; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let Some(env) = $backend.open(concat!(module_path!(), "::", stringify!($test))).await else {
                    return;
                };
                $file::$test(&env).await;
                env.cleanup().await;
            }
        )*
    };
}

conformance! {
    sqlite_file => Backend::SqliteFile,
    sqlite_memory => Backend::SqliteMemory,
    postgres => Backend::Postgres,
    mysql => Backend::MySql,
    redis => Backend::Redis,
}
