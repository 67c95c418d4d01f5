#!/usr/bin/env bash
# ElasticMQ, an SQS-compatible server (Maven Central's jars), for the SQS tests and the benchmark.
#
#   scripts/elasticmq.sh fetch             jars into the cache (once)
#   scripts/elasticmq.sh start DIR [PORT]  start it (default port: SQS_PORT or 25020); prints its endpoint
#   scripts/elasticmq.sh stop DIR          stop it
#
# It keeps queues in memory. What the SQS tests rely on, all implemented by ElasticMQ: long polling,
# the visibility timeout (and ChangeMessageVisibility), ApproximateReceiveCount, batch send and delete,
# FIFO queues (message groups delivered in order, one group's next messages held while earlier ones
# are in flight, deduplication by MessageDeduplicationId within 5 minutes) and redrive policies
# (a message received maxReceiveCount times moves to the dead-letter queue).
#
# Environment: ELASTICMQ_VERSION (default 1.7.1), IDEM_ELASTICMQ_CACHE (default ~/.cache/idem-ci/elasticmq).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/maven-jars.sh"

VERSION="${ELASTICMQ_VERSION:-1.7.1}"
CACHE="${IDEM_ELASTICMQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idem-ci/elasticmq}/$VERSION"

die() { echo "elasticmq.sh: $*" >&2; exit 1; }

fetch() { maven_jars "$CACHE" "org.elasticmq:elasticmq-server_2.13:$VERSION" || die "fetching ElasticMQ $VERSION failed"; }

port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local dir="$1" port="${2:-${SQS_PORT:-25020}}"
  fetch
  mkdir -p "$dir"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then echo "http://127.0.0.1:$port"; return 0; fi
  cat >"$dir/elasticmq.conf" <<EOF
include classpath("application.conf")
node-address { protocol = http, host = 127.0.0.1, port = $port, context-path = "" }
rest-sqs { enabled = true, bind-port = $port, bind-hostname = "127.0.0.1", sqs-limits = strict }
rest-stats { enabled = false }
EOF
  setsid java -Xms32m -Xmx256m -Dconfig.file="$dir/elasticmq.conf" -cp "$CACHE/libs/*" \
    org.elasticmq.server.Main >>"$dir/server.log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  for _ in $(seq 1 240); do
    port_up "$port" && { echo "http://127.0.0.1:$port"; return 0; }
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -20 "$dir/server.log" >&2; die "ElasticMQ exited"; }
    sleep 0.25
  done
  die "ElasticMQ did not listen on $port within 60 s"
}

stop() {
  local dir="$1" pid
  [ -f "$dir/pid" ] || return 0
  pid="$(cat "$dir/pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/pid"
}

case "${1:-}" in
  fetch) fetch; echo "$CACHE/libs" ;;
  start) [ -n "${2:-}" ] || die "usage: elasticmq.sh start DIR [PORT]"; start "$2" "${3:-}" ;;
  stop) [ -n "${2:-}" ] || die "usage: elasticmq.sh stop DIR"; stop "$2" ;;
  *) die "usage: elasticmq.sh fetch | start DIR [PORT] | stop DIR" ;;
esac
