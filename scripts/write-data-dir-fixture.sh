#!/usr/bin/env bash
# Writes the data-directory fixture of this release's format (issue 28: "a data
# directory made by this release is kept as a test fixture so that every later release
# proves it still reads it"). Run by hand, once, when a release introduces a format;
# never in CI. The fixture is read by `a_data_directory_of_format_N_still_reads` in
# crates/fenced-server/tests/it/restart.rs, which knows what this script puts in it:
#
#   - lock `fixture-held`, held with token 1 by the implicit lease LEASE below
#     (300 s TTL), which the test retries to get the same grant back;
#   - lock `fixture-writer`, granted token 2 and released;
#   - store key `fixture-key` = "format N" (the directory's format), written with token 2;
#   - (from format 3) a snapshot of all of the above (from format 4 in the file
#     `snapshot`, not in raft.redb): the server snapshots every 10
#     entries here, and keepalives of LEASE add entries until one is taken;
#   - (from format 5) the log in segments, `log/` (its prepared spare is not kept).
#
#   scripts/write-data-dir-fixture.sh [--bin PATH] DIR
#
# DIR must be absent (an existing fixture is never overwritten: delete it first if you
# mean to). Exit 0 when the fixture is written, 1 when a step failed, 2 for bad
# arguments.
set -euo pipefail

bin=target/release/fenced
dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || { echo "usage: $0 [--bin PATH] DIR" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin is not an executable: build it (cargo build --release -p fenced) or pass --bin" >&2; exit 2; }
[ ! -e "$dir" ] || { echo "$dir exists: delete it first to write the fixture again" >&2; exit 2; }

# Keep in step with FIXTURE_LEASE in crates/fenced-server/tests/it/restart.rs.
LEASE=6f1d2c3b4a5968778695a4b3c2d1e0f1
WRITER_LEASE=0b6e4f1a9c3d27e58f104a6b3c9d2e71

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
FENCED_SNAPSHOT_ENTRIES=10 "$bin" server --listen "127.0.0.1:$port" --data-dir "$dir" >"$dir.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -fsS "$url/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

fail() { echo "FAIL: $*" >&2; exit 1; }
post() { curl -sS -X POST -H 'content-type: application/json' -d "$2" "$url$1"; }
expect() { # what, answer, jq-free check by substring
  case "$2" in *"$3"*) ;; *) fail "$1: $2" ;; esac
}

expect "acquire fixture-held" "$(post /v1/locks/fixture-held/acquire "{\"lease_id\":\"$LEASE\",\"ttl_ms\":300000}")" '"token":1'
expect "acquire fixture-writer" \
  "$(post /v1/locks/fixture-writer/acquire "{\"lease_id\":\"$WRITER_LEASE\",\"ttl_ms\":300000}")" '"token":2'
format=$(sed -n 's/^fenced data directory \(format [0-9]*\)$/\1/p' "$dir/FORMAT")
[ -n "$format" ] || fail "the server wrote no FORMAT file in $dir"
code=$(curl -sS -o /dev/null -w '%{http_code}' -X PUT -H 'fencing-token: 2' --data-binary "$format" "$url/v1/store/fixture-key")
[ "$code" = 200 ] || fail "write fixture-key: HTTP $code"
expect "release fixture-writer" "$(post /v1/locks/fixture-writer/release "{\"lease_id\":\"$WRITER_LEASE\"}")" '"token":2'

for _ in $(seq 40); do
  case "$(curl -sS "$url/v1/cluster")" in *'"snapshot_index":null'*) ;; *) break ;; esac
  post "/v1/leases/$LEASE/keepalive" '{}' >/dev/null
  sleep 0.05
done
case "$(curl -sS "$url/v1/cluster")" in *'"snapshot_index":null'*) fail "no snapshot was taken" ;; esac

kill -TERM "$pid"
wait "$pid" || fail "the server did not stop cleanly (see $dir.log)"
trap - EXIT
rm -f "$dir.log" "$dir/log/spare.tmp"
echo "wrote $dir: $(cat "$dir/FORMAT")"
