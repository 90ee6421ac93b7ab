#!/bin/bash
# Fenced and redis-aof (appendfsync always) with their logs on tmpfs (/dev/shm), where an
# fdatasync costs nothing: the path a command takes through each server, without the disk.
# Alternated three times, uncontended. BENCHMARKS.md, "The path without the disk".
#   scripts/shm.sh            (C=clients, default 1; S=seconds a run, default 3;
#                              B=the fenced binary, default target/release/fenced)
set -u
B=${B:-target/release/fenced}; C=${C:-1}; S=${S:-3}
fenced() {
  local dd=/dev/shm/fenced-shm; rm -rf $dd
  $B server --data-dir $dd --listen 127.0.0.1:7400 --wire-listen 127.0.0.1:7712 > /dev/null 2>&1 & local p=$!
  sleep 1.5
  echo "fenced c=$C $($B bench --endpoint fenced://127.0.0.1:7712 --workload uncontended --clients $C --duration ${S}s 2>&1 | grep -o '^  [0-9]* ops/s.*p50 [0-9.]* ms')"
  kill $p; wait $p 2>/dev/null; rm -rf $dd
}
redis() {
  local dd=/dev/shm/redis-shm; rm -rf $dd; mkdir -p $dd
  redis-server --port 7379 --appendonly yes --appendfsync always --dir $dd --save '' > /dev/null 2>&1 & local p=$!
  sleep 1
  echo "redis-aof c=$C $($B bench --target redis-aof --endpoint redis://127.0.0.1:7379 --workload uncontended --clients $C --duration ${S}s 2>&1 | grep -o '^  [0-9]* ops/s.*p50 [0-9.]* ms')"
  kill $p; wait $p 2>/dev/null; rm -rf $dd
}
for _ in 1 2 3; do fenced; redis; done
