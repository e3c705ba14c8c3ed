//! Deciding, at each observation, what every rule of a service does: a pure state machine.
//!
//! The engine owns no clock and no timer: the caller hands it the observations and the
//! instant they belong to, so the same decisions come out of a test that steps a manual
//! clock, a simulation, and the center's collector loop. Publishing is not its business
//! either: it says *fire* or *revert*, the caller publishes, and tells it with
//! [`RuleEngine::undo`] when that failed. Nor does it remember across processes: the caller
//! keeps a record of each firing and, when it starts over, tells the engine which rules are
//! fired with [`RuleEngine::restore`] (the changes of the last hour that count toward the
//! cap are not restored: a restart may allow that many more).
//!
//! Each rule is in one of three phases. **Idle**: the condition does not hold. **Pending**:
//! it holds, since some instant; after `for` the rule fires. **Active**: it fired; once the
//! condition has *cleared* (the exit thresholds, see [`Condition`](super::Condition)) for
//! `exit_for`, and at least `min_hold` after firing, it reverts. Holding again while
//! clearing starts the clearing over. Between the enter and exit thresholds nothing moves,
//! which is what keeps an input hovering at a threshold from flapping the policy.
//!
//! **Hourly cap.** A service's rules make at most `max_changes_per_hour` changes (firings and
//! reverts) in any hour. A rule fires only when the last hour leaves room for the firing
//! *and* its revert, so a revert is never refused: refusing it would leave an emergency
//! setting in place with nothing to take it back. A rule that may not fire stays pending
//! and says [`Verdict::Capped`]; it fires when room frees up and the condition still holds.
//! Dry-run rules change nothing and count nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Rule;
use super::observe::{Observations, Series};

const HOUR: Duration = Duration::from_secs(3600);

/// What one rule does at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The condition does not hold; nothing to do.
    Quiet,
    /// The condition holds, for less than `for` so far.
    Pending {
        /// How long it has held.
        held: Duration,
    },
    /// Apply the rule's actions now.
    Fire,
    /// Would fire, but the service's hourly cap leaves no room for a change and its revert.
    Capped,
    /// Fired earlier; the condition has not cleared (or not for long enough, or `min_hold`
    /// has not passed).
    Hold,
    /// Undo the rule's actions now.
    Revert,
}

/// One rule's verdict at one instant, with the values it was decided on.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The rule's name.
    pub rule: String,
    /// What to do.
    pub verdict: Verdict,
    /// Whether the rule is a dry run (record, do not publish).
    pub dry_run: bool,
    /// The value of every series the rule's condition reads (`None`: not observed).
    pub observed: Vec<(Series, Option<f64>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Pending {
        since: Instant,
    },
    Active {
        fired: Instant,
        clearing: Option<Instant>,
    },
}

#[derive(Clone, Debug)]
struct State {
    rule: Rule,
    phase: Phase,
    /// The phase before the last decision, for [`RuleEngine::undo`].
    before: Phase,
}

/// The rules of one service and where each one stands.
///
/// ```
/// use std::time::{Duration, Instant};
/// use stormguard::rules::{Observations, RuleEngine, RuleSet, Series, Verdict};
///
/// let set = RuleSet::from_toml(r#"
///     [[rules]]
///     name = "cdn-504"
///     service = "web"
///     endpoint = "GET /img/*"
///     for = "10s"
///     when = { series = "error_ratio", code = 504, above = 0.1, exit_below = 0.02 }
///     actions = [{ set = "attempts", max_attempts = 1 }]
/// "#)?;
/// let mut engine = RuleEngine::new(set.rules, set.max_changes_per_hour);
/// let mut seen = Observations::new();
/// seen.set_endpoint("GET /img/*", Series::ErrorRatioCode(504), 0.4);
/// let t0 = Instant::now();
/// assert!(matches!(engine.decide(&seen, t0)[0].verdict, Verdict::Pending { .. }));
/// assert_eq!(engine.decide(&seen, t0 + Duration::from_secs(10))[0].verdict, Verdict::Fire);
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RuleEngine {
    states: Vec<State>,
    max_changes_per_hour: u32,
    /// When each counted change of the last hour was made, oldest first.
    changes: VecDeque<Instant>,
}

impl RuleEngine {
    /// An engine for `rules` (all of one service), every rule idle.
    pub fn new(rules: Vec<Rule>, max_changes_per_hour: u32) -> Self {
        let mut engine = RuleEngine {
            states: Vec::new(),
            max_changes_per_hour,
            changes: VecDeque::new(),
        };
        engine.set_rules(rules, max_changes_per_hour);
        engine
    }

    /// Replaces the rules. A rule whose definition is unchanged keeps its phase. A rule
    /// changed while it had fired stays fired if it still changes the same thing the same
    /// way ([`Rule::acts_like`]: its change is still in the policy, and only a revert takes
    /// it out), and reverts by its new exit condition; otherwise it starts idle: whoever
    /// edited it reverts its change first (the center does, before storing the edit). A
    /// changed rule that was pending starts over, as does a new one. A removed rule is
    /// forgotten (the center reverts a fired rule before deleting it).
    pub fn set_rules(&mut self, rules: Vec<Rule>, max_changes_per_hour: u32) {
        let mut old = std::mem::take(&mut self.states);
        self.states = rules
            .into_iter()
            .map(
                |rule| match old.iter().position(|s| s.rule.name == rule.name) {
                    Some(i) if old[i].rule == rule => old.swap_remove(i),
                    Some(i)
                        if matches!(old[i].phase, Phase::Active { .. })
                            && old[i].rule.acts_like(&rule) =>
                    {
                        let phase = old.swap_remove(i).phase;
                        State {
                            rule,
                            phase,
                            before: phase,
                        }
                    }
                    _ => State {
                        rule,
                        phase: Phase::Idle,
                        before: Phase::Idle,
                    },
                },
            )
            .collect();
        self.max_changes_per_hour = max_changes_per_hour;
    }

    /// The rules.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.states.iter().map(|s| &s.rule)
    }

    /// Whether the rule named `name` has fired and not reverted.
    pub fn is_active(&self, name: &str) -> bool {
        self.states
            .iter()
            .any(|s| s.rule.name == name && matches!(s.phase, Phase::Active { .. }))
    }

    /// Sets where the rule named `name` stands from what it last published: fired at `fired`
    /// and not reverted since (`Some`), or not fired (`None`). A process that starts over
    /// rules that fired in an earlier one calls it, so that they revert when their
    /// condition clears; so does one whose rules were changed by someone else. A rule
    /// restored as fired counts the revert it owes against the hourly cap; one already
    /// fired keeps its own instants; one restored as not fired that was fired becomes idle
    /// (pending and idle rules stay as they are). Dry-run rules publish nothing and are left
    /// alone.
    pub fn restore(&mut self, name: &str, fired: Option<Instant>) {
        let Some(state) = self
            .states
            .iter_mut()
            .find(|s| s.rule.name == name && !s.rule.dry_run)
        else {
            return;
        };
        let phase = match (fired, state.phase) {
            (Some(_), Phase::Active { .. }) | (None, Phase::Idle | Phase::Pending { .. }) => {
                return;
            }
            (Some(fired), _) => Phase::Active {
                fired,
                clearing: None,
            },
            (None, Phase::Active { .. }) => Phase::Idle,
        };
        state.phase = phase;
        state.before = phase;
    }

    /// What every rule does at `now`, given what was observed then. `now` should not go
    /// backwards; an earlier instant is read as no time passing.
    pub fn decide(&mut self, seen: &Observations, now: Instant) -> Vec<Decision> {
        while self
            .changes
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= HOUR)
        {
            self.changes.pop_front();
        }
        let mut decisions = Vec::with_capacity(self.states.len());
        for index in 0..self.states.len() {
            let verdict = self.step(index, seen, now);
            let state = &self.states[index];
            decisions.push(Decision {
                rule: state.rule.name.clone(),
                verdict,
                dry_run: state.rule.dry_run,
                observed: state.rule.when.values(seen, &state.rule.endpoint),
            });
        }
        decisions
    }

    fn step(&mut self, index: usize, seen: &Observations, now: Instant) -> Verdict {
        // Room for this firing and its revert, after the changes of the last hour and the
        // reverts the other fired rules still owe (a revert is never refused, so each one
        // is counted as if it came now).
        let owed = self
            .states
            .iter()
            .filter(|s| !s.rule.dry_run && matches!(s.phase, Phase::Active { .. }))
            .count();
        let room = self.changes.len() + owed + 2 <= self.max_changes_per_hour as usize;
        let state = &mut self.states[index];
        state.before = state.phase;
        let rule = &state.rule;
        let since = |t: Instant| now.saturating_duration_since(t);
        let (phase, verdict) = match state.phase {
            Phase::Idle | Phase::Pending { .. } if !rule.when.holds(seen, &rule.endpoint) => {
                (Phase::Idle, Verdict::Quiet)
            }
            Phase::Idle | Phase::Pending { .. } => {
                let start = match state.phase {
                    Phase::Pending { since } => since,
                    _ => now,
                };
                if since(start) < rule.hold {
                    (
                        Phase::Pending { since: start },
                        Verdict::Pending { held: since(start) },
                    )
                } else if rule.dry_run || room {
                    (
                        Phase::Active {
                            fired: now,
                            clearing: None,
                        },
                        Verdict::Fire,
                    )
                } else {
                    (Phase::Pending { since: start }, Verdict::Capped)
                }
            }
            Phase::Active { fired, clearing } => {
                if !rule.when.clears(seen, &rule.endpoint) {
                    (
                        Phase::Active {
                            fired,
                            clearing: None,
                        },
                        Verdict::Hold,
                    )
                } else {
                    let clearing = clearing.unwrap_or(now);
                    if since(clearing) >= rule.exit_hold && since(fired) >= rule.min_hold {
                        (Phase::Idle, Verdict::Revert)
                    } else {
                        (
                            Phase::Active {
                                fired,
                                clearing: Some(clearing),
                            },
                            Verdict::Hold,
                        )
                    }
                }
            }
        };
        let counts = !rule.dry_run && matches!(verdict, Verdict::Fire | Verdict::Revert);
        state.phase = phase;
        if counts {
            self.changes.push_back(now);
        }
        verdict
    }

    /// Takes back the last decision of the rule named `name`: its firing or revert could not
    /// be published. The rule returns to where it was (pending, or fired) and tries again at
    /// the next decision; the change no longer counts toward the hourly cap.
    pub fn undo(&mut self, name: &str) {
        let Some(state) = self.states.iter_mut().find(|s| s.rule.name == name) else {
            return;
        };
        let counted = !state.rule.dry_run && state.phase != state.before;
        let made_change = matches!(
            (state.before, state.phase),
            (Phase::Active { .. }, Phase::Idle)
                | (Phase::Idle | Phase::Pending { .. }, Phase::Active { .. })
        );
        state.phase = state.before;
        if counted && made_change {
            self.changes.pop_back();
        }
    }
}
