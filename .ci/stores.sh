# --- stormguard-idempotency: database servers for the store tests --------------------------
# Source this from .ci/run before `cargo test` (it exports variables). It starts PostgreSQL,
# MariaDB and Redis if they are down, waits (bounded) until each answers, makes sure the
# `test` databases exist, exports STORMGUARD_TEST_{POSTGRES,MYSQL,REDIS}_URL and
# STORMGUARD_REQUIRE_ALL_STORES=1 (so a store test can never silently skip in CI), and exits
# non-zero with a clear message if a server cannot be reached.

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

export STORMGUARD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:5432/test"
export STORMGUARD_TEST_MYSQL_URL="mysql://root@127.0.0.1:3306/test"
export STORMGUARD_TEST_REDIS_URL="redis://127.0.0.1:6379/"
export STORMGUARD_REQUIRE_ALL_STORES=1
echo "ci: store test URLs exported"

# Then, for example:
#   cargo test -p stormguard-idempotency --all-features
#   cargo clippy -p stormguard-idempotency --all-features --all-targets -- -D warnings
# -----------------------------------------------------------------------------------------
