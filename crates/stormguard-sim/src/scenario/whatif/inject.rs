//! Faults injected into one service for a window of time: `KIND:SERVICE@START+DURATION`.
//!
//! | kind | the service, while the window lasts |
//! | --- | --- |
//! | `outage` | refuses every request at once (connection refused: retryable) |
//! | `latency+200ms` | works 200 ms longer on every request |
//! | `latency*10` | works 10 times as long on every request |
//! | `503=0.3` | answers 30 % of requests with a 503 at once, without working |
//!
//! Start and duration use the core's duration grammar (`10s`, `1.5s`, `250ms`).

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use stormguard::duration::{format_duration, parse_duration};

use crate::error::InvalidParam;
use crate::time::{Nanos, nanos};

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum Fault {
    /// Every request refused at once.
    Outage,
    /// This much added to every request's work.
    #[serde(with = "crate::report::seconds")]
    AddLatency(Duration),
    /// Every request's work multiplied by this.
    ScaleLatency(f64),
    /// This share of requests answered with a 503 at once.
    Errors503(f64),
}

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Injection {
    /// What goes wrong.
    pub fault: Fault,
    /// The service it happens to.
    pub service: String,
    /// When it starts.
    #[serde(with = "crate::report::seconds")]
    pub start: Duration,
    /// How long it lasts.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
}

/// The largest latency multiplier an injection may give.
pub const MAX_SCALE: f64 = 1e6;

impl Injection {
    /// Parses `KIND:SERVICE@START+DURATION`; the error names `--inject` and the part that
    /// is wrong.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_sim::scenario::whatif::{Fault, Injection};
    ///
    /// let i = Injection::parse("latency*10:db@5s+2s")?;
    /// assert_eq!((i.fault, i.service.as_str()), (Fault::ScaleLatency(10.0), "db"));
    /// assert_eq!((i.start, i.duration), (Duration::from_secs(5), Duration::from_secs(2)));
    /// assert!(Injection::parse("flood:db@5s+2s").is_err());
    /// # Ok::<(), stormguard_sim::InvalidParam>(())
    /// ```
    pub fn parse(text: &str) -> Result<Injection, InvalidParam> {
        let bad = |why: String| InvalidParam::new("inject", format!("{text:?}: {why}"));
        let shape = || bad("expected KIND:SERVICE@START+DURATION, e.g. outage:db@10s+30s".into());
        let (kind, rest) = text.split_once(':').ok_or_else(shape)?;
        let (service, window) = rest.rsplit_once('@').ok_or_else(shape)?;
        let (start, length) = window.split_once('+').ok_or_else(shape)?;
        if service.is_empty() {
            return Err(bad("no service named".into()));
        }
        let start = parse_duration(start).map_err(|e| bad(format!("start: {e}")))?;
        let duration = parse_duration(length).map_err(|e| bad(format!("duration: {e}")))?;
        if duration.is_zero() {
            return Err(bad("the duration must be above zero".into()));
        }
        let fraction = |v: &str| -> Result<f64, InvalidParam> {
            match v.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(bad(format!("503={v}: a share of requests, 0..=1"))),
            }
        };
        let fault = if kind == "outage" {
            Fault::Outage
        } else if let Some(added) = kind.strip_prefix("latency+") {
            Fault::AddLatency(parse_duration(added).map_err(|e| bad(format!("latency: {e}")))?)
        } else if let Some(factor) = kind.strip_prefix("latency*") {
            match factor.parse::<f64>() {
                Ok(f) if (0.0..=MAX_SCALE).contains(&f) => Fault::ScaleLatency(f),
                _ => {
                    return Err(bad(format!(
                        "latency*{factor}: a multiplier between 0 and {MAX_SCALE}"
                    )));
                }
            }
        } else if let Some(share) = kind.strip_prefix("503=") {
            Fault::Errors503(fraction(share)?)
        } else {
            return Err(bad(format!(
                "unknown kind {kind:?}; expected outage, latency+DURATION, latency*FACTOR or 503=SHARE"
            )));
        };
        Ok(Injection {
            fault,
            service: service.to_owned(),
            start,
            duration,
        })
    }

    /// When it ends.
    pub fn end(&self) -> Duration {
        self.start.saturating_add(self.duration)
    }

    pub(super) fn window(&self) -> (Nanos, Nanos) {
        (nanos(self.start), nanos(self.end()))
    }
}

impl fmt::Display for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fault {
            Fault::Outage => f.write_str("outage")?,
            Fault::AddLatency(d) => write!(f, "latency+{}", format_duration(d))?,
            Fault::ScaleLatency(x) => write!(f, "latency*{x}")?,
            Fault::Errors503(p) => write!(f, "503={p}")?,
        }
        write!(
            f,
            ":{}@{}+{}",
            self.service,
            format_duration(self.start),
            format_duration(self.duration)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_and_prints_back() {
        for text in [
            "outage:db@10s+30s",
            "latency+200ms:db@1s+1s",
            "latency*10:web@0s+5s",
            "503=0.3:pay@2s+3s",
        ] {
            let i = Injection::parse(text).expect(text);
            assert_eq!(i.to_string(), text);
        }
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_an_injection_or_an_error(text in "(?s).{0,60}") {
            let _ = Injection::parse(&text);
        }

        #[test]
        fn injection_like_text_parses_back_to_itself(
            kind in "(outage|latency\\+[0-9]{1,4}ms|latency\\*[0-9]{1,3}|503=0\\.[0-9])",
            service in "[a-z]{1,8}",
            start in 0u32..1000,
            length in 1u32..1000,
        ) {
            let text = format!("{kind}:{service}@{start}s+{length}s");
            let parsed = Injection::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            proptest::prop_assert_eq!(Injection::parse(&parsed.to_string()), Ok(parsed));
        }
    }

    #[test]
    fn bad_injections_name_the_part() {
        for (text, part) in [
            ("outage", "KIND:SERVICE"),
            ("outage:db@10s", "KIND:SERVICE"),
            ("outage:@1s+1s", "no service"),
            ("outage:db@x+1s", "start"),
            ("outage:db@1s+0s", "above zero"),
            ("503=2:db@1s+1s", "0..=1"),
            ("latency*-1:db@1s+1s", "multiplier"),
            ("latency+1:db@1s+1s", "latency"),
            ("slow:db@1s+1s", "unknown kind"),
        ] {
            let e = Injection::parse(text).expect_err(text).to_string();
            assert!(e.contains("--inject") && e.contains(part), "{text}: {e}");
        }
    }
}
