//! The long help of `stormguard simulate` and its scenarios: one paragraph per scenario
//! saying what it runs and what its figures mean for choosing a policy, and the JSON schema.

/// `stormguard simulate --help`.
pub(crate) const SIMULATE: &str = "\
Simulate retries on a virtual clock, with stormguard's real policy objects.

Every wait comes from the core's Backoff, every retry/stop decision (attempts, deadline,
budget) from RetryRun::finish_attempt, every budget decision from the core's budgets. Runs
are deterministic: the same --seed prints the same bytes.

  storm     N clients fail at once and retry R times: total retries, peak per bin, last
            retry, per backoff strategy. Without jitter the peak stays at N (exponential
            backoff only moves it later); full jitter cuts it about six-fold.
  chain     L layers each retrying over a failing service: traffic per layer. Every layer
            retrying multiplies (27x for 3 layers x 2 retries); retry at one layer only (3x),
            or budget every layer and pass 'don't retry' up (about 1.1x).
  budget    success drops from --before to --after: how fast each budget kind shuts retries
            off (seeds' bucket about 20 ms, gRPC A6 about 11 ms at 1000 req/s and 50 %).
  overload  a server near capacity, timeouts, retries and a trigger: does goodput come back
            after the trigger? Unprotected retries keep it stuck (metastable); a budget or
            jitter + deadline recovers.
  occ       clients contending on optimistic concurrency: calls and completion time per
            jitter kind; full jitter needs less than half the calls of plain exponential.
  converge  a server's handler gets twice slower mid-run under 3x load: how fast each
            adaptive concurrency limit follows (limit and in-flight over time).

Output: --format table (default) or json; --plot FILE.svg or FILE.png draws a figure that
answers the scenario's question (the file is created before the run: a path that cannot be
written is refused at once). JSON is one array of row objects; every row has \"scenario\", \"strategy\" (the
row's backoff strategy, chain mode, budget kind or protection), \"label\", \"parameters\"
(the run's flags, durations in seconds) and the row's figures under the names shown in
each scenario's --help. Exit status: 0 ok, 1 I/O error, 2 bad input.";

/// `stormguard simulate storm --help`.
pub(crate) const STORM: &str = "\
N clients fail at t = 0 and each retries R times (retry k waits the strategy's delay:
fixed base; linear base*k; exponential min(cap, base*2^(k-1)); full jitter uniform[0, t);
equal jitter t/2 + uniform[0, t/2); decorrelated min(cap, uniform[base, 3*previous))).
Retries are counted in bins. The defaults reproduce the seeds' table: 1000 clients,
4 retries, base 1s, cap 30s, 100ms bins.

What the figures mean: fixed and exponential both peak at N retries per bin — every
client's k-th retry lands in the same instant, exponential only pushes the instants later
(last retry 15 s instead of 4 s). Only jitter spreads them: full jitter peaks near N/6
(about 160 of 1000), equal jitter keeps a minimum gap at the price of a higher peak (about
216), decorrelated spreads from the first retry on (about 73) but runs longest. Choose
jitter whenever clients can fail together; full jitter unless a minimum gap is required.

--plot: one panel per strategy on shared axes, retries per bin on a log scale, time up to
where 95 % of every strategy's retries are sent.

JSON keys per row: scenario, strategy, label, parameters, total_retries, peak_per_bin,
peak_at_s, last_retry_s.";

/// `stormguard simulate chain --help`.
pub(crate) const CHAIN: &str = "\
L layers call each other (entry first); the last calls a service that fails each attempt
with probability --fail-prob (1.0: down). Each layer retries its call up to r times, so
when the service is down it sees the product of (1 + r_i): 27x for 3 layers x 2 retries,
64x for 3 x 3, 243x for 5 layers x 3 tries. Modes: every-layer; entry-only (only the entry
retries: 1 + r); budget (every layer retries within its own ratio budget of --retry-ratio
of requests, a fraction — each layer adds about 10 % but they compound, about 1.1^L);
budget-nack (the same, and a layer that gave up after retrying answers 'don't retry', so
only the lowest layer retries: about 1.1x).

What the figures mean: retry at exactly one layer, and make the others fail fast and say
so; a per-layer budget bounds each layer, not the chain.

--plot: requests per entry request at each hop, per mode, on a log scale.

JSON keys per row: scenario, strategy (the mode), label, parameters, requests_per_layer
(entry first, service last), amplification_per_layer, amplification (service requests per
entry request), success_rate.";

/// `stormguard simulate budget --help`.
pub(crate) const BUDGET: &str = "\
--rate requests per second arrive evenly; each attempt takes --latency and succeeds with
probability --before until --step-at, then --after. Each request may retry --retries times
(exponential backoff from --base, full jitter), within the budget under test shared by
all: none, seeds (a retry spends 1 token, a success refunds --token-ratio, allowed while at
least 1 token), grpc (gRPC A6: a failure costs 1, allowed above --max-tokens/2), aws (500
tokens, 5 per retry), ratio (Finagle: --retry-ratio of requests, a fraction, over --ttl
plus --min-retries-per-sec), concurrency (Envoy: --budget-percent of requests in flight, a
percentage). The numbers follow the policy file's rules (the budgets' own constructors
check both), whichever kinds run: --token-ratio 0.001..=1, --retry-ratio 0..=1,
--budget-percent 0..=100, --max-tokens 1..=1000, --ttl 1s..=60s.
Failures are spread evenly by default, as in the seeds' arithmetic (--failures random
draws them).

What the figures mean: shutoff_ms is how long the downstream is hit with full retries after
its success rate drops. Token buckets react in tens of milliseconds (seeds' variant about
20 ms, gRPC about 11 ms at 1000 req/s and 50 %) and then pin retries to what successes pay
for; the AWS quota lasts about a third of a second; a ratio budget settles near its percent
of requests; a concurrency budget bounds retries in flight, not a rate.

--plot: one panel per budget kind, retries per second with the drop marked.

JSON keys per row: scenario, strategy (the budget kind), label, parameters, shutoff_ms
(null when nothing was refused), retries_per_s_before, retries_per_s_after,
retry_share_after, load_after, success_after, refused, retries_per_s (one value per bin).";

/// `stormguard simulate overload --help`.
pub(crate) const OVERLOAD: &str = "\
A server serves --capacity requests per second in FIFO order, --slowdown times slower
while more than that was offered over the last second; --rate requests per second arrive
evenly; clients time out after --timeout and retry --retries times. A trigger
(outage: the server drops everything; capacity-drop: capacity x --drop-to; spike: --spike
extra requests per second) starts at --trigger-at and lasts --trigger-for. Protections,
printed side by side: none (retry at once); budget (the same within a shared --budget,
gRPC A6 by default); jitter-deadline (full-jitter backoff from --base, a caller deadline of
--deadline checked before each retry against backoff + --min-call, and carried to the
server, which refuses work whose caller has given up); all; limit (the server protects
itself: the core's adaptive concurrency limit, --limit-algorithm, and deadline shedding,
with clients that still retry at once and without a budget; a shed request costs the
server nothing, so only admitted work counts toward the slowdown).

What the figures mean: the defaults are Bronson et al.'s metastable failure — 280 req/s
against capacity 300, 1 s timeout, one retry, a 10 s outage. Without protection the retries
keep the offered load near 560 req/s with almost no goodput long after the outage: the
retries, not the trigger, sustain the overload. A budget stops the retries; a deadline
stops retries that cannot help and work nobody waits for; either recovers. After a spike
only the deadline recovers (a budget alone leaves the server working through stale
queue); with --deadline 2s the jitter row stays stuck: jitter spreads load, it does not
remove it. The limit row recovers within about a second of the outage's end although the
clients retry blindly, and holds goodput near capacity at --rate 600 or 900.

--plot: one panel per protection, goodput and offered load with the trigger shaded.

JSON keys per row: scenario, strategy (the protection), label, parameters, goodput_before,
offered_before, offered_peak, after_window_s, goodput_after, offered_after, latency_after_ms, recovered,
recovery_s, wasted, expired, shed, series (t_s, offered, goodput, latency_ms per bin).";

/// `stormguard simulate occ --help`.
pub(crate) const OCC: &str = "\
Brooker's 'Exponential Backoff And Jitter' set-up: --clients clients start together, each
updating one shared row once by reading its version and writing conditionally; a write
whose version is stale fails and the client backs off (base --base, cap --cap) and tries
again. Every message takes |N(--delay, --delay-sd)|. Averaged over --runs runs.

What the figures mean: calls is the work the contended resource does. Without jitter the
clients that collided keep colliding: at 100 clients plain exponential backoff needs about
1850 writes and a minute; full jitter needs less than half the calls (about 875) and
finishes in about 5 s; equal jitter needs as few calls but finishes later; decorrelated
needs a few more calls and finishes as fast. Spread retries, do not just delay them.

--plot: writes and time to finish per strategy (bars; lines over several --clients).

JSON keys per row: scenario, strategy, label, parameters, clients, calls, completion_ms.";

/// `stormguard simulate converge --help`.
pub(crate) const CONVERGE: &str = "\
A server of --workers workers serves the requests its adaptive concurrency limit admitted
(the core's Limiter, one row per --limit-algorithm, on the virtual clock), FIFO; each takes
--service of work, --slowdown times more from --change-at on. Requests arrive as a Poisson
stream at --load times the first capacity (workers / service), so only the limit decides
how long the queue gets; over the limit a request is shed on arrival. A request that waited
longer than --timeout is dropped when a worker reaches it (its caller left), which the
limiter counts as a drop.

What the figures mean: a CPU-bound server needs about --workers requests in flight whatever
its speed; an RTT-based limit first takes the doubled round trip for a queue. converged is
the time from the change until every later bin's mean round-trip time is at most twice the
new service time (a short queue); goodput is the share of the capacity served before and
after the change. With the defaults Vegas converges within a second and serves about 99 %
of the capacity on both sides (its pinned probe of the no-load RTT learns the new service
time); Gradient2 reacts as fast but its limit drifts up under a queue that never drains;
AIMD sees only drops, so its limit grows until requests time out.

--plot: one panel per algorithm, the limit and the requests in flight over time, the change
marked.

JSON keys per row: scenario, strategy (the algorithm), label, parameters, limit_before,
limit_after, goodput_before, goodput_after, rtt_after_ms, converged_s, shed, timed_out,
series (t_s, limit, in_flight, goodput, rtt_ms per bin).";

pub(crate) const POLICY: &str = "\
Runs your call graph (--graph, the file `policy lint` reads) with its policies as the
production objects build them: every call goes through the core's retry decision with its
attempts, backoff, per-try and overall timeouts and minimum call time, its retry budget and
circuit breaker, on a virtual clock. Entry endpoints (those nobody calls) receive --rate
requests per second in all (shared by their requests_per_sec), evenly spaced, for
--duration; requests in flight at the end then finish so their retries are counted.
--inject KIND:SERVICE@START+DURATION breaks one service for a while: outage (refused at
once), latency+200ms (added work), latency*10 (work multiplied), 503=0.3 (a share answered
503 at once). Repeat it for several faults.

The model: an endpoint works for its own latency (a histogram bucket's bound drawn by count,
or the quantile function through its percentiles; nothing given: no time), fails with its
failure_rate, then makes its calls one after the other; the time of its calls comes on top.
A service has `workers` (no limit by default) and a FIFO `queue` (no limit by default); a
request holds its worker while it waits for its calls, and one that finds the queue full is
answered 503. Deadlines travel with each attempt; a service that honours_deadline (the
default) drops queued requests whose caller gave up and stops work at the deadline. A service
with retry_signal answers \"already retried\" when it gave up on a call it retries, and does
not retry that answer itself. Not modelled: hedging (one attempt), the throttle, connect
timeouts, time windows.

Per service: offered load (requests/s arriving, and the busiest bin), amplification (requests
per entry request), success (answered with success / arrived), served (got a worker),
latency P50/P99/P999 of successful answers, queue peak and length at the end, and the time
from the end of the last fault until it is back: every later 5-bin window within 5 points of
its success share before the faults and at most 25 % above its load. `never`: not before the
run ended. With --against OLD both graphs run with the same seed and faults and print side by
side.

--plot: one panel per service, requests arriving per second over time for each graph, the
faults shaded.

JSON: an array of one report per graph (version \"graph\" or \"against\"): scenario,
version, parameters, entry_requests, entry_success_rate, events, services (service,
requests, offered_per_sec, peak_per_sec, amplification, success_rate, served, abandoned,
p50_ms, p99_ms, p999_ms, queue_peak, queue_at_end, recover_s, recovered, offered_series,
ok_series, served_series).";
