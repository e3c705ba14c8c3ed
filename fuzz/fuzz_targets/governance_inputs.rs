//! The governance tools' readers of untrusted text: a call graph (TOML and JSON), a CSV of
//! latencies, a Prometheus text exposition (also what the policy center scrapes) and a
//! Prometheus query-API answer (also what the center's PromQL collector reads). Any text is a value or a typed error, never a
//! panic; what is read is usable (lint runs over a graph, percentiles come out of every
//! histogram or are `None`, advice from any latencies).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard::advise::{Percentiles, advise, csv, prometheus};
use stormguard::graph::CallGraph;
use stormguard::lint::{LintConfig, lint_graph};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 5 {
        0 | 1 => {
            let graph = if which % 5 == 0 {
                CallGraph::from_toml(text)
            } else {
                CallGraph::from_json(text)
            };
            if let Ok(graph) = graph {
                let _ = lint_graph(&graph, &LintConfig::default());
            }
        }
        2 => {
            if let Ok(data) = csv::parse(text) {
                for samples in data.values() {
                    let p = Percentiles::of_samples(samples).expect("a row gives a sample");
                    assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999);
                    let _ = advise(&p, Some(&p));
                }
            }
        }
        3 => {
            let _ = prometheus::api::instant_vector(text);
            let _ = prometheus::api::range_matrix(text);
        }
        _ => {
            if let Ok(histograms) = prometheus::parse(text, "lat", "endpoint") {
                for h in histograms.values() {
                    if let Some(p) = h.percentiles() {
                        let _ = advise(&p, None);
                    }
                }
            }
        }
    }
});
