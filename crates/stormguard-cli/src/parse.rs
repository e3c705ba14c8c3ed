//! Value parsers for the command line: durations through the core's grammar, and names.
//!
//! Every parser returns a message that clap prints after `invalid value 'X' for '--flag'`,
//! so a bad value always names its flag and exits with status 2.

use std::time::Duration;

use stormguard::duration::parse_duration;
use stormguard_sim::budgets::BudgetKind;
use stormguard_sim::scenario::budget::FailurePattern;
use stormguard_sim::scenario::chain::ChainMode;
use stormguard_sim::scenario::overload::{LimitKind, Protection, Trigger};
use stormguard_sim::scenario::whatif::Injection;
use stormguard_sim::strategy::Strategy;

/// A duration such as `200ms` or `1.5s` (the core's grammar: a unit is required).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn one_of<T: Copy>(s: &str, all: &[T], name: fn(T) -> &'static str) -> Result<T, String> {
    all.iter().copied().find(|&x| name(x) == s).ok_or_else(|| {
        let names: Vec<_> = all.iter().map(|&x| name(x)).collect();
        format!("unknown name '{s}'; expected one of: {}", names.join(", "))
    })
}

/// A backoff strategy name.
pub(crate) fn strategy(s: &str) -> Result<Strategy, String> {
    one_of(s, &Strategy::ALL, Strategy::name)
}

/// A chain mode name.
pub(crate) fn chain_mode(s: &str) -> Result<ChainMode, String> {
    one_of(s, &ChainMode::ALL, ChainMode::name)
}

/// A budget kind name.
pub(crate) fn budget_kind(s: &str) -> Result<BudgetKind, String> {
    one_of(s, &BudgetKind::ALL, BudgetKind::name)
}

/// An overload protection name.
pub(crate) fn protection(s: &str) -> Result<Protection, String> {
    one_of(s, &Protection::ALL, Protection::name)
}

/// A limit algorithm name.
pub(crate) fn limit_kind(s: &str) -> Result<LimitKind, String> {
    one_of(s, &LimitKind::ALL, LimitKind::name)
}

/// An overload trigger name.
pub(crate) fn trigger(s: &str) -> Result<Trigger, String> {
    Trigger::parse(s)
        .ok_or_else(|| format!("unknown trigger '{s}'; expected outage, capacity-drop or spike"))
}

/// A fault to inject, `KIND:SERVICE@START+DURATION`.
pub(crate) fn injection(s: &str) -> Result<Injection, String> {
    Injection::parse(s).map_err(|e| e.reason)
}

/// A failure pattern name.
pub(crate) fn failures(s: &str) -> Result<FailurePattern, String> {
    FailurePattern::parse(s)
        .ok_or_else(|| format!("unknown pattern '{s}'; expected spread or random"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_the_core_grammar() {
        assert_eq!(duration("200ms"), Ok(Duration::from_millis(200)));
        assert!(duration("-1s").is_err_and(|e| e.contains("negative")));
        assert!(duration("250").is_err_and(|e| e.contains("unit")));
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let e = strategy("fibonacci").expect_err("unknown");
        assert!(e.contains("decorrelated"), "{e}");
        assert_eq!(strategy("full"), Ok(Strategy::Full));
        assert!(budget_kind("grpc").is_ok());
        assert!(chain_mode("budget-nack").is_ok());
        assert!(protection("all").is_ok());
        assert!(trigger("spike").is_ok());
        assert!(failures("random").is_ok());
    }
}
