#!/usr/bin/env bash
# Builds the sidecar as it ships: `stormguard` with profile-guided optimisation.
#
#   crates/stormguard-proxy/pgo.sh [--profile sidecar] [--seconds 5]
#   crates/stormguard-proxy/pgo.sh --profdata     # prints the llvm-profdata it would use
#
# Why: a proxied request crosses hyper, tokio, tower and our crates, more code than fits
# the instruction cache, and it is laid out by guesses. A profile of the proxy at work tells
# LLVM which branches are taken and which functions are hot, so it lays the hot path out
# together and inlines along it (BENCHMARKS.md has the figures).
#
# Steps, each in its own target directory so that the usual builds stay cached:
# 1. the sidecar bench, built normally: its upstream and load-generator roles drive the
#    training (they are not instrumented, so only the proxy's work is in the profile);
# 2. `stormguard` built with `-Cprofile-generate` (target/pgo-generate);
# 3. training: `stormguard proxy egress --workers 1` between the two: GETs, then GETs and
#    POSTs without a key while the upstream answers 503 to one request in ten; each load
#    must be answered without a connection error, and the proxy exits on SIGTERM, which
#    writes its profile;
# 4. `llvm-profdata merge` (the one matching rustc's LLVM; see `profdata` below);
# 5. `stormguard` built with `-Cprofile-use`: target/pgo/<host>/<profile>/stormguard;
# 6. a check that it serves: 400 requests through it, each answered 200.
# The builds pass `--target` (the host), so the flags reach the binary's crates but not
# build scripts or proc macros, which would write profiles of their own.
#
# The bench measures that binary beside HAProxy and nginx:
#   cargo bench --profile sidecar -p stormguard-proxy --bench sidecar -- \
#       --stormguard "$(crates/stormguard-proxy/pgo.sh)"
#
# Progress goes to stderr; stdout is the built binary's path. Exit status: 2 for a bad flag
# or a missing tool, 1 when a step fails.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/../.."
root=$PWD

usage() {
    echo "pgo.sh: $1 (try --help)" >&2
    exit 2
}
profile=sidecar
seconds=5
only_profdata=
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) [ $# -ge 2 ] || usage "--profile needs a value"; profile=$2; shift 2 ;;
        --seconds) [ $# -ge 2 ] || usage "--seconds needs a value"; seconds=$2; shift 2 ;;
        --profdata) only_profdata=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) usage "unknown argument $1" ;;
    esac
done
case "$seconds" in
    ''|*[!0-9]*|0) usage "--seconds must be a whole number above 0, not $seconds" ;;
esac
# cargo's directory for a profile: the built-in ones share two; the others have their own.
case "$profile" in
    dev|test) dir=debug ;;
    release|bench) dir=release ;;
    *) dir=$profile ;;
esac
host=$(rustc -vV | sed -n 's/^host: //p')

# llvm-profdata must read the raw profiles of rustc's own LLVM: $LLVM_PROFDATA, rustup's
# llvm-tools component, or a system LLVM of the same major version.
profdata() {
    local major candidate version
    major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
    for candidate in "${LLVM_PROFDATA:-}" "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata" \
        "llvm-profdata-$major" llvm-profdata; do
        [ -n "$candidate" ] && command -v "$candidate" >/dev/null || continue
        version=$("$candidate" --version 2>/dev/null) || continue
        if [[ $version == *"LLVM version $major."* ]]; then
            echo "$candidate"
            return
        fi
    done
    echo "pgo.sh: no llvm-profdata for LLVM $major (rustc's): rustup component add llvm-tools," \
        "or install LLVM $major (Debian: apt-get install llvm-$major), or set LLVM_PROFDATA" >&2
    exit 2
}
merge=$(profdata)
if [ -n "$only_profdata" ]; then
    echo "$merge"
    exit 0
fi

# The path of the executable cargo built for the given target name.
executable() {
    python3 -c 'import json, sys
print(next(m["executable"] for m in map(json.loads, sys.stdin)
           if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1]
           and m.get("executable")))' "$1"
}
# `stormguard` built into target directory $1 with the extra rustc flag $2.
build_cli() {
    CARGO_TARGET_DIR="$1" RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }$2" \
        cargo build -q --profile "$profile" --target "$host" -p stormguard-cli
    echo "$1/$host/$dir/stormguard"
}

echo "pgo: 1/6 the bench's upstream and load roles" >&2
bench=$(cargo bench -q --profile "$profile" -p stormguard-proxy --bench sidecar --no-run \
    --message-format=json | executable sidecar)

echo "pgo: 2/6 stormguard, instrumented" >&2
raw="$root/target/pgo-generate/profiles"
rm -rf "$raw"
instrumented=$(build_cli "$root/target/pgo-generate" "-Cprofile-generate=$raw")

upstream=
proxy=
stop() {
    local pid
    for pid in $upstream $proxy; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    upstream=
    proxy=
}
trap stop EXIT
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_port() {
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
    echo "pgo.sh: nothing listens on 127.0.0.1:$1" >&2
    exit 1
}
# The bench's upstream, and the `stormguard` binary $1 as an egress proxy in front of it with
# the bench's policy (any further arguments are VAR=value for its environment).
serve() {
    local binary=$1
    shift
    up_port=$(free_port)
    "$bench" --role upstream --port "$up_port" >/dev/null &
    upstream=$!
    proxy_port=$(free_port)
    env "$@" "$binary" proxy egress --workers 1 --log warn --drain 1s \
        --listen "127.0.0.1:$proxy_port" --upstream "127.0.0.1:$up_port" \
        --policy "$root/crates/stormguard-proxy/benches/sidecar/policy.toml" >/dev/null &
    proxy=$!
    wait_port "$up_port"
    wait_port "$proxy_port"
}
# $1 seconds of the generator through the proxy (further arguments are its flags), bounded
# in time; fails unless every request got an answer (with ONLY=200: a 200); prints the
# generator's summary.
load() {
    local seconds=$1 summary
    shift
    summary=$(timeout $((seconds + 30)) "$bench" --role load --seconds "$seconds" \
        --url "http://127.0.0.1:$proxy_port/" "$@") ||
        { echo "pgo.sh: the load failed or hung ($*)" >&2; exit 1; }
    python3 -c 'import json, sys
r, only = json.loads(sys.argv[1]), sys.argv[2]
answered = r["statuses"].get(only, 0) if only else sum(r["statuses"].values())
if r["errors"] or answered != r["sent"]:
    sys.exit("pgo.sh: requests went unanswered (with " + (only or "any status") + "): " + str(r))' \
        "$summary" "${ONLY:-}"
    echo "$summary"
}
# The bench's upstream answers 503 to every Nth request after GET /__mode/N (asked
# directly, whatever http_proxy says).
mode() {
    python3 -c 'import sys, urllib.request
urllib.request.build_opener(urllib.request.ProxyHandler({})).open(sys.argv[1]).read()' \
        "http://127.0.0.1:$up_port/__mode/$1"
}

echo "pgo: 3/6 training for $((seconds * 4)) s" >&2
serve "$instrumented" LLVM_PROFILE_FILE="$raw/proxy-%p.profraw"
load "$seconds" --rate 20000 >/dev/null
mode 10
load "$seconds" --rate 5000 >/dev/null
load "$seconds" --rate 2000 --method POST >/dev/null
mode 0
load "$seconds" --rate 20000 >/dev/null
kill -TERM "$proxy"
wait "$proxy" || { echo "pgo.sh: the instrumented proxy did not exit cleanly" >&2; exit 1; }
proxy=
stop

echo "pgo: 4/6 merging the profile" >&2
mkdir -p "$root/target/pgo"
"$merge" merge -o "$root/target/pgo/merged.profdata" "$raw"/proxy-*.profraw
# Cargo does not watch the file a flag names: the profile's name carries its digest, so a
# new profile changes RUSTFLAGS and every crate is built again with it.
digest=$(sha256sum "$root/target/pgo/merged.profdata" | cut -c1-16)
profile_data="$root/target/pgo/stormguard-proxy-$digest.profdata"
rm -f "$root"/target/pgo/stormguard-proxy-*.profdata
mv "$root/target/pgo/merged.profdata" "$profile_data"

echo "pgo: 5/6 stormguard with the profile" >&2
shipped=$(build_cli "$root/target/pgo" "-Cprofile-use=$profile_data")

echo "pgo: 6/6 the built stormguard serves: 400 requests, each a 200" >&2
serve "$shipped"
ONLY=200 load 1 --rate 400 >&2
stop
echo "$shipped"
