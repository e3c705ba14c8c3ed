# --- stormguard-idempotency: database and broker servers for the store tests ---------------
# Source this from .ci/run before `cargo test` (it exports variables). It starts PostgreSQL,
# MariaDB, Redis, RabbitMQ and NATS (with JetStream) if they are down (and Prometheus, for the
# `advise timeouts` and PromQL collector tests; see the end of this file), waits (bounded) until
# each answers, makes sure the `test` databases exist, exports
# STORMGUARD_TEST_{POSTGRES,MYSQL,REDIS,AMQP,NATS}_URL and STORMGUARD_REQUIRE_ALL_STORES=1 (so
# a store or broker test can never silently skip in CI), and exits non-zero with a clear
# message if a server cannot be reached.

sg_fail() {
    echo "ci: ERROR: $*" >&2
    exit 1
}

# sg_wait NAME SECONDS COMMAND...: retry COMMAND every 0.5 s until it succeeds or time runs out.
sg_wait() {
    local name=$1 secs=$2
    shift 2
    local tries=$((secs * 2))
    for _ in $(seq 1 "$tries"); do
        if "$@" >/dev/null 2>&1; then
            echo "ci: $name is up"
            return 0
        fi
        sleep 0.5
    done
    sg_fail "$name did not answer within ${secs}s (checked with: $*)"
}

# PostgreSQL (trust auth on 127.0.0.1, database `test`).
if ! pg_isready -h 127.0.0.1 -p 5432 -q >/dev/null 2>&1; then
    echo "ci: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start \
        || echo "ci: pg_ctlcluster failed; waiting anyway" >&2
fi
sg_wait PostgreSQL 60 pg_isready -h 127.0.0.1 -p 5432 -q
if ! psql -h 127.0.0.1 -U postgres -d test -Atqc 'SELECT 1' >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null 2>&1 || true
fi
psql -h 127.0.0.1 -U postgres -d test -Atqc 'SELECT 1' >/dev/null 2>&1 \
    || sg_fail "PostgreSQL is up but postgres@127.0.0.1/test cannot be queried (auth or database)"

# MariaDB (root with an empty password, database `test`).
if ! mysqladmin -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; then
    echo "ci: starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd \
        || echo "ci: start-stop-daemon failed; waiting anyway" >&2
fi
sg_wait MariaDB 60 mysqladmin -h 127.0.0.1 -P 3306 -uroot ping
mysql -h 127.0.0.1 -P 3306 -uroot -e 'CREATE DATABASE IF NOT EXISTS test' \
    || sg_fail "MariaDB is up but root@127.0.0.1 cannot create/use database test"

# Redis (no persistence; CI only).
if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" != "PONG" ]; then
    echo "ci: starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log \
        || echo "ci: redis-server failed; waiting anyway" >&2
fi
sg_redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }
sg_wait Redis 30 sg_redis_ping

# RabbitMQ (guest/guest on 127.0.0.1:5672). rabbitmqctl needs the Erlang cookie of the node;
# the AMQP port answering is what the tests need, so that is what is waited for.
sg_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
sg_amqp_up() { sg_port_open 5672; }
if ! sg_amqp_up; then
    echo "ci: starting RabbitMQ"
    rabbitmq-server -detached || echo "ci: rabbitmq-server failed; waiting anyway" >&2
fi
sg_wait RabbitMQ 90 sg_amqp_up

# NATS with JetStream on 127.0.0.1:4222.
sg_nats_up() { sg_port_open 4222; }
if ! sg_nats_up; then
    echo "ci: starting NATS (JetStream)"
    mkdir -p /var/lib/nats-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log \
        || echo "ci: nats-server failed; waiting anyway" >&2
fi
sg_wait NATS 30 sg_nats_up

export STORMGUARD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:5432/test"
export STORMGUARD_TEST_MYSQL_URL="mysql://root@127.0.0.1:3306/test"
export STORMGUARD_TEST_REDIS_URL="redis://127.0.0.1:6379/"
export STORMGUARD_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/%2f"
export STORMGUARD_TEST_NATS_URL="nats://127.0.0.1:4222"
# PostgreSQL's programs (initdb, pg_ctl) for the tests that run a server of their own, to stop
# and start it (the center's PostgreSQL restart test): the newest installed version.
STORMGUARD_TEST_PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
[ -x "$STORMGUARD_TEST_PG_BIN/initdb" ] && [ -x "$STORMGUARD_TEST_PG_BIN/pg_ctl" ] \
    || sg_fail "no PostgreSQL bin directory with initdb and pg_ctl under /usr/lib/postgresql"
export STORMGUARD_TEST_PG_BIN
export STORMGUARD_REQUIRE_ALL_STORES=1
echo "ci: store and broker test URLs exported"

# Then, for example:
#   cargo test -p stormguard-idempotency --all-features
#   cargo clippy -p stormguard-idempotency --all-features --all-targets -- -D warnings
# -----------------------------------------------------------------------------------------

# Prometheus (Debian's `prometheus`), scraping every second the test services of
# crates/stormguard-cli/tests/advise.rs (`advise timeouts --prometheus`, 127.0.0.1:19091) and
# crates/stormguard-center/tests/collect_promql.rs (the center's PromQL collector,
# 127.0.0.1:19092). The configuration is written on every run; a Prometheus already running
# with an older one is told to reload it (SIGHUP), never stopped.
SG_PROM_DIR=/tmp/stormguard-ci-prometheus
mkdir -p "$SG_PROM_DIR/data"
cat >"$SG_PROM_DIR/prometheus.yml.new" <<'YAML'
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: stormguard-advise-test
    static_configs:
      - targets: ["127.0.0.1:19091"]
  - job_name: stormguard-rules-test
    static_configs:
      - targets: ["127.0.0.1:19092"]
YAML
if cmp -s "$SG_PROM_DIR/prometheus.yml.new" "$SG_PROM_DIR/prometheus.yml"; then
    rm -f "$SG_PROM_DIR/prometheus.yml.new"
    sg_prom_changed=0
else
    mv "$SG_PROM_DIR/prometheus.yml.new" "$SG_PROM_DIR/prometheus.yml"
    sg_prom_changed=1
fi
if curl -sf http://127.0.0.1:19090/-/ready >/dev/null 2>&1; then
    if [ "$sg_prom_changed" = 1 ]; then
        # The process listening on :19090 (started by an earlier run, with or without our
        # pid file).
        sg_prom_pid=$(cat "$SG_PROM_DIR/prometheus.pid" 2>/dev/null || true)
        if [ -z "$sg_prom_pid" ] || ! kill -0 "$sg_prom_pid" 2>/dev/null; then
            sg_prom_pid=$(ss -Hltnp 'sport = :19090' 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2)
        fi
        if [ -n "$sg_prom_pid" ] && kill -HUP "$sg_prom_pid" 2>/dev/null; then
            echo "ci: Prometheus (pid $sg_prom_pid) told to reload its configuration"
        else
            echo "ci: WARNING: cannot find the Prometheus on :19090 to reload it; new targets are not scraped" >&2
        fi
    fi
else
    command -v prometheus >/dev/null 2>&1 \
        || apt-get install -y -q prometheus >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; } \
        || sg_fail "cannot install Debian's prometheus"
    echo "ci: starting Prometheus"
    start-stop-daemon --start --oknodo --background --make-pidfile \
        --pidfile "$SG_PROM_DIR/prometheus.pid" --exec /usr/bin/prometheus -- \
        --config.file="$SG_PROM_DIR/prometheus.yml" --storage.tsdb.path="$SG_PROM_DIR/data" \
        --storage.tsdb.retention.time=1d --web.listen-address=127.0.0.1:19090 \
        || echo "ci: start-stop-daemon failed for prometheus; waiting anyway" >&2
fi
sg_wait Prometheus 60 curl -sf http://127.0.0.1:19090/-/ready
export STORMGUARD_TEST_PROMETHEUS_URL=http://127.0.0.1:19090
export STORMGUARD_TEST_PROMETHEUS_TARGET=127.0.0.1:19091
export STORMGUARD_TEST_PROMETHEUS_RULES_TARGET=127.0.0.1:19092
