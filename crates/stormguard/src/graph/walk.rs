//! Walking a call graph without recursion and without enumerating paths.
//!
//! A graph's paths can be exponentially many (a diamond of 30 layers has 2³⁰) and
//! arbitrarily long, so every walk here goes over the *endpoints* once, in topological
//! order (callers before callees, Kahn's algorithm with an explicit queue), carrying per
//! endpoint whatever a rule needs (the worst amplification of any path reaching it, the
//! depth of the longest). The cycle check is an iterative depth-first search with an explicit
//! stack. Nothing recurses, so a 10,000-call chain cannot overflow the stack, and a depth
//! cap ([`MAX_DEPTH`]) refuses graphs deeper than any real system with a typed error.

use std::collections::{BTreeMap, VecDeque};

use super::{Call, CallGraph, Service};

/// The most calls that may follow each other on one path (a chain of 10,000 calls is
/// accepted; the 10,001st call is refused with [`GraphError::TooDeep`](super::GraphError::TooDeep)).
pub const MAX_DEPTH: usize = 10_000;

/// An endpoint: its service's name and its own.
pub type EndpointId<'a> = (&'a str, &'a str);

impl CallGraph {
    /// Every endpoint, each after every endpoint that calls it (ties by name).
    ///
    /// ```
    /// use stormguard::graph::CallGraph;
    ///
    /// let graph = CallGraph::from_toml(r#"
    ///     [[services.a.endpoints."GET /".calls]]
    ///     to = "b"
    ///     endpoint = "GET /b"
    ///     policy = { retry = { max_attempts = 1 } }
    ///     [services.b.endpoints."GET /b"]
    /// "#)?;
    /// assert_eq!(graph.topological_order(), [("a", "GET /"), ("b", "GET /b")]);
    /// # Ok::<(), stormguard::graph::GraphError>(())
    /// ```
    pub fn topological_order(&self) -> Vec<EndpointId<'_>> {
        topological_order(&self.services)
    }

    /// The calls made by an endpoint (empty for one the graph does not have).
    pub fn calls_of(&self, (service, endpoint): EndpointId<'_>) -> &[Call] {
        self.services
            .get(service)
            .and_then(|s| s.endpoints.get(endpoint))
            .map_or(&[], |e| e.calls.as_slice())
    }
}

/// Kahn's algorithm over `services`' calls; in a graph with a cycle, the endpoints on or
/// after it are left out.
pub(super) fn topological_order(services: &BTreeMap<String, Service>) -> Vec<EndpointId<'_>> {
    let mut incoming: BTreeMap<EndpointId<'_>, usize> = BTreeMap::new();
    for (name, service) in services {
        for endpoint in service.endpoints.keys() {
            incoming
                .entry((name.as_str(), endpoint.as_str()))
                .or_insert(0);
        }
    }
    for service in services.values() {
        for endpoint in service.endpoints.values() {
            for call in &endpoint.calls {
                if let Some(n) = incoming.get_mut(&(call.service.as_str(), call.endpoint.as_str()))
                {
                    *n += 1;
                }
            }
        }
    }
    let mut ready: VecDeque<EndpointId<'_>> = incoming
        .iter()
        .filter(|&(_, &n)| n == 0)
        .map(|(&id, _)| id)
        .collect();
    let mut order = Vec::with_capacity(incoming.len());
    while let Some(id) = ready.pop_front() {
        order.push(id);
        let calls = services
            .get(id.0)
            .and_then(|s| s.endpoints.get(id.1))
            .map_or(&[][..], |e| e.calls.as_slice());
        for call in calls {
            let next = (call.service.as_str(), call.endpoint.as_str());
            if let Some(n) = incoming.get_mut(&next) {
                *n -= 1;
                if *n == 0 {
                    ready.push_back(next);
                }
            }
        }
    }
    order
}

/// The call that closes a cycle, if the calls form one: an iterative depth-first search.
pub(super) fn cycle(services: &BTreeMap<String, Service>) -> Option<&Call> {
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let calls_of = |id: EndpointId<'_>| -> &[Call] {
        services
            .get(id.0)
            .and_then(|s| s.endpoints.get(id.1))
            .map_or(&[], |e| e.calls.as_slice())
    };
    let mut state: BTreeMap<EndpointId<'_>, u8> = BTreeMap::new();
    for (name, service) in services {
        for endpoint in service.endpoints.keys() {
            let root = (name.as_str(), endpoint.as_str());
            if state.contains_key(&root) {
                continue;
            }
            state.insert(root, ON_PATH);
            let mut stack: Vec<(EndpointId<'_>, usize)> = vec![(root, 0)];
            while let Some(top) = stack.last_mut() {
                let (id, next) = *top;
                let Some(call) = calls_of(id).get(next) else {
                    state.insert(id, DONE);
                    stack.pop();
                    continue;
                };
                top.1 += 1;
                let callee = (call.service.as_str(), call.endpoint.as_str());
                match state.get(&callee) {
                    Some(&ON_PATH) => return Some(call),
                    Some(_) => {}
                    None => {
                        state.insert(callee, ON_PATH);
                        stack.push((callee, 0));
                    }
                }
            }
        }
    }
    None
}

/// The first call (in topological order) that is deeper than [`MAX_DEPTH`], with its depth.
pub(super) fn too_deep(services: &BTreeMap<String, Service>) -> Option<(&Call, usize)> {
    let order = topological_order(services);
    let mut depth: BTreeMap<EndpointId<'_>, usize> = BTreeMap::new();
    for id in order {
        let here = depth.get(&id).copied().unwrap_or(0);
        let calls = services
            .get(id.0)
            .and_then(|s| s.endpoints.get(id.1))
            .map_or(&[][..], |e| e.calls.as_slice());
        for call in calls {
            if here + 1 > MAX_DEPTH {
                return Some((call, here + 1));
            }
            let d = depth
                .entry((call.service.as_str(), call.endpoint.as_str()))
                .or_insert(0);
            *d = (*d).max(here + 1);
        }
    }
    None
}
