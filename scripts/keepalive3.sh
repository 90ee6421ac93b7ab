#!/usr/bin/env bash
# Keepalives on a three-member Fenced cluster on loopback: starts three members, runs
# `fenced bench --workload keepalive` against the leader's wire listener, and prints the
# bench's figures, the leader's keepalive counters and log index, and the CPU the three
# members used (lease creation included) over the run.
#
#   cargo build --release -p fenced && scripts/keepalive3.sh [SECONDS] [LEASES]
#
# FENCED_BIN picks the members' binary (default target/release/fenced); the bench is
# always target/release/fenced. Ports 7501-7503 (HTTP) and 7721-7723 (wire) must be free.
set -euo pipefail
secs=${1:-20}
leases=${2:-30000}
bin=${FENCED_BIN:-target/release/fenced}
bench=target/release/fenced
dir=$(mktemp -d /tmp/fenced-keepalive3-XXXX)
peers="1=http://127.0.0.1:7501,2=http://127.0.0.1:7502,3=http://127.0.0.1:7503"
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for i in 1 2 3; do
  FENCED_LOG=warn "$bin" server --listen 127.0.0.1:750$i --wire-listen 127.0.0.1:772$i --node-id $i \
    --peers "$peers" --insecure-peers --data-dir "$dir/member$i" >"$dir/log$i" 2>&1 &
  pids+=($!)
done
leader=""
for _ in $(seq 150); do
  leader=$(curl -s 127.0.0.1:7501/v1/cluster |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("leader_id") or "")' 2>/dev/null || true)
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "no leader within 30 s" >&2; exit 1; }
sleep 1
cpu_ticks() {
  local sum=0
  for p in "${pids[@]}"; do sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$sum"
}
before=$(cpu_ticks)
"$bench" bench --endpoint "fenced://127.0.0.1:772$leader" --workload keepalive --leases "$leases" \
  --ttl 10s --duration "${secs}s"
after=$(cpu_ticks)
curl -s "127.0.0.1:750$leader/metrics" | grep -E '^fenced_keepalives(_from_memory)?_total|^fenced_raft_last_log_index'
tick_ms=$((1000 / $(getconf CLK_TCK)))
echo "members' CPU: $(((after - before) * tick_ms)) ms over the run (lease creation included)"
