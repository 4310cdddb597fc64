#!/usr/bin/env bash
# A local Citus cluster for development and the test suite: a coordinator and two workers on
# loopback, each its own PostgreSQL 15 data directory and port, Citus preloaded, the workers
# registered with the coordinator (docs/citus.md#a-local-cluster); and a spare fourth node, a worker-to-be that
# is started but registered nowhere, for the test that adds a worker and rebalances under load
# (tests/reliability/test_citus_rebalance.py registers it in its own database only).
#
#   scripts/citus.sh build    install Citus into the system PostgreSQL 15 when it is not there
#                             (or another build is): built from the vendored source
#                             (../shared/vendor/citus), checked by its sha256, with the fixes in
#                             scripts/citus-patches applied; the Debian build dependencies
#                             installed when missing
#   scripts/citus.sh start    build if needed, then make (first time) and start the four nodes
#                             (a node that runs another build of Citus is restarted)
#   scripts/citus.sh stop     stop the four nodes (their data stays)
#   scripts/citus.sh status   each node: running or not; the workers the coordinator knows
#
# Every node's settings are in its `metering.conf`, rewritten at every start (a data directory an
# older version of this script made gets them too) and included last by its postgresql.conf; a
# running node whose new settings need a restart is restarted. Among them `wal_level = logical`:
# a shard moves while it takes writes by logical replication.
#
# Idempotent: each step does only what is missing. Ports: CITUS_PORT (coordinator, 9700), the
# next two (the workers) and the one after (the spare); data under CITUS_DIR
# (/tmp/metering-citus). As root the nodes run as `postgres`.
set -euo pipefail
cd "$(dirname "$0")/.."

CITUS_DIR="${CITUS_DIR:-/tmp/metering-citus}"
CITUS_PORT="${CITUS_PORT:-9700}"
PORTS=("$CITUS_PORT" "$((CITUS_PORT + 1))" "$((CITUS_PORT + 2))" "$((CITUS_PORT + 3))")
NAMES=(coordinator worker1 worker2 worker3)
WORKERS=(1 2)  # registered with the coordinator; worker3 is the spare
PGBIN="${PGBIN:-/usr/lib/postgresql/15/bin}"
# The vendored source sits beside the repository (../shared); a git worktree finds it beside the
# main checkout.
VENDOR="${CITUS_VENDOR:-../shared/vendor/citus}"
if ! test -d "$VENDOR"; then
    VENDOR="$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null)/../../shared/vendor/citus"
fi
TARBALL="citus-13.2.2.tar.gz"
TARBALL_SHA256="cd67db89b77180fdfaede0b3b4c5f2e0965ef7d729b1f43fa7711edeea4601a0"
# The fixes applied to that source (each a file of scripts/citus-patches, with its reasons), and
# the name the build gives itself for them: citus_version() says `Citus 13.2.2+metering.1 on …`,
# which tells `metering migrate` that its local plans do not pile up (docs/citus.md).
PATCHES="scripts/citus-patches"
BUILD_VERSION="13.2.2+metering.1"
BUILD_DEPS=(postgresql-server-dev-15 liblz4-dev libzstd-dev libkrb5-dev patch)

as_postgres() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

installed() {  # this script's build of Citus, not only some build
    test -f /usr/lib/postgresql/15/lib/citus.so &&
        test -f /usr/share/postgresql/15/extension/citus.control &&
        grep -q -a -F "Citus $BUILD_VERSION on " /usr/lib/postgresql/15/lib/citus.so
}

build() {
    if installed; then
        return 0
    fi
    local tarball="$VENDOR/$TARBALL"
    if ! test -f "$tarball"; then
        echo "FATAL: $tarball is missing; Citus is built from the vendored source only" >&2
        exit 1
    fi
    if ! echo "$TARBALL_SHA256  $tarball" | sha256sum --check --quiet -; then
        echo "FATAL: $tarball does not have the sha256 $TARBALL_SHA256" >&2
        exit 1
    fi
    local missing=()
    for package in "${BUILD_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing Citus's build dependencies: ${missing[*]}"
        # A fresh machine has no package lists yet.
        apt-get -o DPkg::Lock::Timeout=600 update -q
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}"
    fi
    local work
    work=$(mktemp -d)
    echo "building Citus $BUILD_VERSION from $tarball and $PATCHES in $work"
    tar -xzf "$tarball" -C "$work"
    local patch
    for patch in "$PATCHES"/*.patch; do
        patch -d "$work/citus-13.2.2" -p1 --forward --quiet <"$patch"
    done
    (
        cd "$work/citus-13.2.2"
        ./configure --without-libcurl --with-extra-version="${BUILD_VERSION#13.2.2}" \
            PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null
        make -s -j2 with_llvm=no >/dev/null
        make -s install with_llvm=no >/dev/null
    )
    rm -rf "$work"
    installed || { echo "FATAL: the Citus build did not install citus.so" >&2; exit 1; }
    echo "Citus installed into PostgreSQL 15"
}

datadir() { echo "$CITUS_DIR/$1"; }

running() {  # name
    as_postgres "$PGBIN/pg_ctl" -D "$(datadir "$1")" status >/dev/null 2>&1
}

psql_at() {  # port sql...
    local port=$1
    shift
    psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres -tA "$@"
}

# A node's settings, written to its metering.conf at every start.
settings() {  # dir port
    cat <<EOF
# metering's local Citus cluster: written by scripts/citus.sh at every start (edits are lost)
shared_preload_libraries = 'citus'
listen_addresses = 'localhost'
port = $2
unix_socket_directories = '$1'
max_connections = 200
max_prepared_transactions = 200
fsync = off
# Not synchronous_commit = off: a shard move by logical replication ends when the target has
# replayed the source's WAL up to its write position (pg_current_wal_lsn); an asynchronous
# commit is visible, and has released its locks, before its commit record is written, so a
# write committed just before the move's switch-over could stay behind on the old placement
# (tests/reliability/test_citus_rebalance.py lost one in about one run of five).
synchronous_commit = on
full_page_writes = off
shared_buffers = 64MB
# A shard moves while it takes writes (citus_rebalance_start, citus_move_shard_placement) by
# logical replication: a publication and a slot on the source node, a subscription and its apply
# worker on the target, for each move. The rebalancer's tasks and each database's Citus
# maintenance daemon are background workers too.
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
max_worker_processes = 64
max_logical_replication_workers = 32
# The routing tests read what each node ran from its log, through SQL (pg_current_logfile).
logging_collector = on
log_directory = 'log'
log_filename = 'postgresql.log'
log_rotation_size = 0
log_line_prefix = '%m [%p] db=%d '
EOF
}

INCLUDE="include_if_exists = 'metering.conf'"

start() {
    build
    mkdir -p "$CITUS_DIR"
    chown postgres: "$CITUS_DIR" 2>/dev/null || true
    local i
    for i in 0 1 2 3; do
        local name=${NAMES[$i]} port=${PORTS[$i]} dir
        dir=$(datadir "$name")
        if ! test -f "$dir/PG_VERSION"; then
            as_postgres "$PGBIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 \
                --locale=C.UTF-8 >/dev/null
            # Loopback only, and trust: a developer's and CI's throwaway cluster.
            printf 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' |
                as_postgres tee "$dir/pg_hba.conf" >/dev/null
        fi
        settings "$dir" "$port" | as_postgres tee "$dir/metering.conf" >/dev/null
        # Last in postgresql.conf, so it overrides what an older version of this script appended.
        if [ "$(tail -n 1 "$dir/postgresql.conf")" != "$INCLUDE" ]; then
            echo "$INCLUDE" | as_postgres tee -a "$dir/postgresql.conf" >/dev/null
        fi
        if ! running "$name"; then
            as_postgres "$PGBIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start >/dev/null
        elif [ "$(psql_at "$port" -c "SELECT citus_version() LIKE 'Citus $BUILD_VERSION %'")" != t ]
        then
            # Running another build of Citus (preloaded at its start): restarted on this one.
            echo "$name: restarting on Citus $BUILD_VERSION"
            as_postgres "$PGBIN/pg_ctl" -D "$dir" -l "$dir/server.log" -m fast -w -t 60 \
                restart >/dev/null
        else
            # Running already: a setting only a start takes (wal_level, the numbers of slots
            # and workers) differing from the file's (pg_file_settings reads the files afresh
            # and names each it cannot apply now) means a restart; the others, a reload.
            if [ "$(psql_at "$port" -c "SELECT count(*) FROM pg_file_settings f
                    JOIN pg_settings s USING (name)
                    WHERE s.context = 'postmaster' AND f.error IS NOT NULL")" != 0 ]; then
                echo "$name: restarting to take its new settings"
                as_postgres "$PGBIN/pg_ctl" -D "$dir" -l "$dir/server.log" -m fast -w -t 60 \
                    restart >/dev/null
            else
                as_postgres "$PGBIN/pg_ctl" -D "$dir" reload >/dev/null
            fi
        fi
        psql_at "$port" -c "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
    done
    psql_at "${PORTS[0]}" -c "SELECT citus_set_coordinator_host('localhost', ${PORTS[0]})" >/dev/null
    for i in "${WORKERS[@]}"; do
        if [ "$(psql_at "${PORTS[0]}" -c \
            "SELECT count(*) FROM pg_dist_node WHERE nodeport = ${PORTS[$i]}")" = 0 ]; then
            psql_at "${PORTS[0]}" -c "SELECT citus_add_node('localhost', ${PORTS[$i]})" >/dev/null
        fi
    done
    echo "Citus cluster up: coordinator 127.0.0.1:${PORTS[0]}, workers ${PORTS[1]} and" \
        "${PORTS[2]}, a spare node on ${PORTS[3]} (not registered)"
    echo "  METERING_TEST_CITUS_URL=postgresql+psycopg://postgres@127.0.0.1:${PORTS[0]}/postgres"
}

stop() {
    local name
    for name in "${NAMES[@]}"; do
        if running "$name"; then
            as_postgres "$PGBIN/pg_ctl" -D "$(datadir "$name")" -m fast -w stop >/dev/null
        fi
    done
    echo "Citus cluster stopped"
}

status() {
    local i up=0
    for i in 0 1 2 3; do
        local label=${NAMES[$i]}
        [ "$i" = 3 ] && label="$label (the spare, not registered)"
        if running "${NAMES[$i]}"; then
            echo "$label: running on 127.0.0.1:${PORTS[$i]}"
            up=$((up + 1))
        else
            echo "$label: not running"
        fi
    done
    if running coordinator; then
        psql_at "${PORTS[0]}" -c "SELECT 'registered: ' || nodename || ':' || nodeport || ' (' ||
            CASE WHEN groupid = 0 THEN 'coordinator' ELSE 'worker' END || ')'
            FROM pg_dist_node ORDER BY groupid"
    fi
    [ "$up" = 4 ]
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 build|start|stop|status" >&2
    exit 2
    ;;
esac
