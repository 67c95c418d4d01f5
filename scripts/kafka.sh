#!/usr/bin/env bash
# Apache Kafka (KRaft, no ZooKeeper) from Maven Central's jars, for the tests and the benchmark.
#
#   scripts/kafka.sh fetch                      jars into the cache (once; later calls find them there)
#   scripts/kafka.sh start DIR [PORT]           one broker (broker and controller in one JVM), data in DIR
#   scripts/kafka.sh cluster DIR [PORT_BASE]    three of them, one quorum: replication factor 3 and
#                                               min.insync.replicas=2 by default for every topic
#   scripts/kafka.sh node-start DIR N           start node N (1-3) of a cluster again (after node-kill)
#   scripts/kafka.sh node-kill DIR N            kill -9 node N
#   scripts/kafka.sh stop DIR                   stop every node started in DIR (SIGTERM, then SIGKILL)
#
# Ports: a node listens for clients on PORT (+ 2·(N-1) in a cluster) and for its controllers on the
# next port up. Defaults: 25000 for one broker, 25010 for a cluster, or KAFKA_PORT / KAFKA_CLUSTER_PORT.
# `start` and `cluster` print the bootstrap address (`127.0.0.1:25000`, or three of them, comma-separated).
#
# Environment: KAFKA_VERSION (default 4.2.2: the newest 4.x line that @platformatic/kafka, the client idem
# uses, is tested against; 4.4.0 is served too), IDEM_KAFKA_CACHE (default ~/.cache/idem-ci/kafka),
# KAFKA_HEAP (default 384m per node).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/maven-jars.sh"

VERSION="${KAFKA_VERSION:-4.2.2}"
CACHE="${IDEM_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idem-ci/kafka}/$VERSION"
HEAP="${KAFKA_HEAP:-384m}"

die() { echo "kafka.sh: $*" >&2; exit 1; }

fetch() { maven_jars "$CACHE" "org.apache.kafka:kafka_2.13:$VERSION" "org.slf4j:slf4j-nop:1.7.36" || die "fetching Kafka $VERSION failed"; }

port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# config DIR N PORT VOTERS REPLICATION: a combined broker+controller node's properties.
config() {
  local dir="$1" n="$2" port="$3" voters="$4" rf="$5" isr="$6"
  mkdir -p "$dir/node$n/data"
  cat >"$dir/node$n/server.properties" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/node$n/data
num.partitions=6
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
EOF
  echo "$port" >"$dir/node$n/port"
}

format() {
  local dir="$1" n="$2" cluster_id="$3"
  java -Xmx128m -cp "$CACHE/libs/*" kafka.tools.StorageTool format -t "$cluster_id" \
    -c "$dir/node$n/server.properties" --ignore-formatted >"$dir/node$n/format.log" 2>&1 ||
    { cat "$dir/node$n/format.log" >&2; die "formatting node $n failed"; }
}

node_start() {
  local dir="$1" n="$2"
  [ -f "$dir/node$n/server.properties" ] || die "no node $n in $dir"
  if [ -f "$dir/node$n/pid" ] && kill -0 "$(cat "$dir/node$n/pid")" 2>/dev/null; then return 0; fi
  # setsid: the JVM outlives this script and is stopped by its pid.
  setsid java -Xms64m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -cp "$CACHE/libs/*" kafka.Kafka "$dir/node$n/server.properties" >>"$dir/node$n/server.log" 2>&1 </dev/null &
  echo $! >"$dir/node$n/pid"
}

wait_ready() {
  local dir="$1" n="$2" port
  port="$(cat "$dir/node$n/port")"
  for _ in $(seq 1 240); do
    port_up "$port" && return 0
    kill -0 "$(cat "$dir/node$n/pid")" 2>/dev/null || { tail -20 "$dir/node$n/server.log" >&2; die "node $n exited"; }
    sleep 0.25
  done
  die "node $n did not listen on $port within 60 s"
}

cluster_id() { java -Xmx64m -cp "$CACHE/libs/*" kafka.tools.StorageTool random-uuid; }

start_one() {
  local dir="$1" port="${2:-${KAFKA_PORT:-25000}}"
  fetch
  mkdir -p "$dir"
  if [ ! -f "$dir/node1/server.properties" ]; then
    config "$dir" 1 "$port" "1@127.0.0.1:$((port + 1))" 1 1
    format "$dir" 1 "$(cluster_id)"
  fi
  node_start "$dir" 1
  wait_ready "$dir" 1
  echo "127.0.0.1:$port"
}

start_cluster() {
  local dir="$1" base="${2:-${KAFKA_CLUSTER_PORT:-25010}}" voters="" n id
  fetch
  mkdir -p "$dir"
  for n in 1 2 3; do voters="$voters${voters:+,}$n@127.0.0.1:$((base + 2 * (n - 1) + 1))"; done
  if [ ! -f "$dir/node1/server.properties" ]; then
    id="$(cluster_id)"
    for n in 1 2 3; do
      config "$dir" "$n" "$((base + 2 * (n - 1)))" "$voters" 3 2
      format "$dir" "$n" "$id"
    done
  fi
  for n in 1 2 3; do node_start "$dir" "$n"; done
  for n in 1 2 3; do wait_ready "$dir" "$n"; done
  echo "127.0.0.1:$base,127.0.0.1:$((base + 2)),127.0.0.1:$((base + 4))"
}

stop_all() {
  local dir="$1" f pid
  for f in "$dir"/node*/pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    kill "$pid" 2>/dev/null || true
  done
  for f in "$dir"/node*/pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

cmd="${1:-}"
case "$cmd" in
  fetch) fetch; echo "$CACHE/libs" ;;
  start) [ -n "${2:-}" ] || die "usage: kafka.sh start DIR [PORT]"; start_one "$2" "${3:-}" ;;
  cluster) [ -n "${2:-}" ] || die "usage: kafka.sh cluster DIR [PORT_BASE]"; start_cluster "$2" "${3:-}" ;;
  node-start) node_start "$2" "$3"; wait_ready "$2" "$3" ;;
  node-kill) [ -f "$2/node$3/pid" ] && kill -9 "$(cat "$2/node$3/pid")" 2>/dev/null; rm -f "$2/node$3/pid" ;;
  stop) [ -n "${2:-}" ] || die "usage: kafka.sh stop DIR"; stop_all "$2" ;;
  *) die "usage: kafka.sh fetch | start DIR [PORT] | cluster DIR [PORT_BASE] | node-start DIR N | node-kill DIR N | stop DIR" ;;
esac
