#!/usr/bin/env bash
# Three-member Fenced against three-member etcd, side by side, on loopback: each cluster
# is started alone, loaded by `fenced bench` (16 clients, uncontended and contended),
# and stopped. Figures go to BENCHMARKS.md with this command.
#
#   cargo build --release -p fenced && scripts/bench-cluster.sh [DURATION] [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FENCED_BIN:-target/release/fenced}
DURATION=${1:-5s}
REPEAT=${2:-3}
WORK=$(mktemp -d /tmp/bench-cluster.XXXXXX)
pids=()
stop() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; pids=(); }
trap 'stop; rm -rf "$WORK"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.05; done; echo "not up: $1" >&2; return 1; }

# Fenced: three members, each with the wire protocol for the bench's client.
http=(); wire=(); peers=""
for i in 1 2 3; do http+=("$(port)"); wire+=("$(port)"); done
for i in 1 2 3; do peers+="${peers:+,}$i=http://127.0.0.1:${http[$((i-1))]}"; done
for i in 1 2 3; do
  FENCED_LOG=warn "$BIN" server --listen "127.0.0.1:${http[$((i-1))]}" --wire-listen "127.0.0.1:${wire[$((i-1))]}" \
    --data-dir "$WORK/fenced-$i" --node-id "$i" --peers "$peers" & pids+=($!)
done
for i in 1 2 3; do wait_http "http://127.0.0.1:${http[$((i-1))]}/livez"; done
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:${http[0]}/readyz" >/dev/null && break; sleep 0.05; done
endpoints=$(printf 'fenced://127.0.0.1:%s,' "${wire[@]}"); endpoints=${endpoints%,}
echo "== fenced, 3 members ($endpoints)"
"$BIN" bench --target fenced --endpoint "$endpoints" --workload uncontended,contended \
  --clients 16 --duration "$DURATION" --repeat "$REPEAT" --json
stop

# etcd 3.4: three members, fsync per commit (its default).
cl=(); pe=(); initial=""
for i in 1 2 3; do cl+=("$(port)"); pe+=("$(port)"); done
for i in 1 2 3; do initial+="${initial:+,}m$i=http://127.0.0.1:${pe[$((i-1))]}"; done
for i in 1 2 3; do
  etcd --name "m$i" --data-dir "$WORK/etcd-$i" --log-level warn \
    --listen-client-urls "http://127.0.0.1:${cl[$((i-1))]}" --advertise-client-urls "http://127.0.0.1:${cl[$((i-1))]}" \
    --listen-peer-urls "http://127.0.0.1:${pe[$((i-1))]}" --initial-advertise-peer-urls "http://127.0.0.1:${pe[$((i-1))]}" \
    --initial-cluster "$initial" --initial-cluster-state new 2>/dev/null & pids+=($!)
done
for i in 1 2 3; do wait_http "http://127.0.0.1:${cl[$((i-1))]}/health"; done
echo "== etcd, 3 members (clients on member 1)"
"$BIN" bench --target etcd --endpoint "http://127.0.0.1:${cl[0]}" --workload uncontended,contended \
  --clients 16 --duration "$DURATION" --repeat "$REPEAT" --json
stop
