#!/usr/bin/env bash
# A rolling restart under load (issue 28): starts a cluster of three (or --members N)
# `fenced server` processes on free loopback ports, puts load on it through the client
# library (`fenced exec` cycles that write to the fenced store with the lock's token,
# and one long-held lock whose token a `fenced put` loop writes with), restarts every
# member in turn --rounds times the way docs/operations.md (*Rolling restart*) tells an
# operator to (SIGTERM, wait for the exit, start it on the same data directory and
# port, wait until it follows and has applied the leader's commit index, settle, next;
# the leader last in each round), then stops the load and checks:
#
#   - no call failed: every `fenced exec` and `fenced put` exited 0 (a non-zero exit is
#     an error a library caller would have seen, retries and failover included), the
#     held lock was never lost and is still held with its token, every member exited 0
#     on SIGTERM and came back within the bounds;
#   - nothing acknowledged was lost: every key holds its last acknowledged value or a
#     later one, and the sentinel keys written before the first restart are intact;
#   - tokens: strictly increasing per worker, none granted twice;
#   - every member holds the same state (same state_hash at the same applied_index).
#
# Exit 0 only if all of that holds; 1 if a check failed (one `FAIL <check>: ...` line
# each, then the summary); 2 for bad arguments; 3 if the cluster could not be set up.
#
#   scripts/rolling-restart.sh [--bin PATH] [--members 3] [--rounds 2] [--workers 3]
#                              [--settle 2] [--snapshot-entries 100] [--keep]
#                              [--break quorum-loss|amnesia] [--outage 12]
#
# --snapshot-entries is FENCED_SNAPSHOT_ENTRIES of the members: the default 100 makes
# snapshots and log purges frequent during the run (the server's own default is 5000).
# The command `fenced exec` runs takes its endpoints from exec (FENCED_ENDPOINT: every
# member, the one that granted first), so the run checks that a child fails over too.
#
# --break replaces the clean procedure by a wrong one, to show that the checks can fail
# (negative controls; .ci/run runs both and expects exit 1 with FAIL errors, FAIL lost):
#   quorum-loss  round 1 SIGKILLs the leader and a follower together and starts them
#                again only after --outage seconds (longer than the client's 10 s
#                request time-out and the 5 s TTLs): callers see errors.
#   amnesia      round 1 SIGKILLs every member and starts them on empty data
#                directories: acknowledged writes are lost, tokens go back.
# The rounds after the first are clean.
set -u -o pipefail

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${FENCED_BIN:-$root/target/release/fenced}"
members=3 rounds=2 workers=3 settle=2 snapshot_entries=100 keep=0 breaks="" outage=12
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --members) members="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --settle) settle="$2"; shift 2 ;;
    --snapshot-entries) snapshot_entries="$2"; shift 2 ;;
    --outage) outage="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --break) breaks="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "rolling-restart: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
int() { [[ $2 =~ ^[0-9]+$ ]] || { echo "rolling-restart: $1 takes a whole number, not '$2'" >&2; exit 2; }; }
int --members "$members"; int --rounds "$rounds"; int --workers "$workers"; int --outage "$outage"
int --snapshot-entries "$snapshot_entries"
[[ $settle =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "rolling-restart: --settle takes seconds, not '$settle'" >&2; exit 2; }
{ [ "$members" -ge 3 ] && [ $((members % 2)) -eq 1 ]; } || { echo "rolling-restart: --members must be odd and at least 3" >&2; exit 2; }
[ "$rounds" -ge 1 ] && [ "$workers" -ge 1 ] || { echo "rolling-restart: --rounds and --workers must be at least 1" >&2; exit 2; }
case "$breaks" in ""|quorum-loss|amnesia) ;; *) echo "rolling-restart: --break quorum-loss or amnesia, not '$breaks'" >&2; exit 2 ;; esac
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
[ -x "$bin" ] || { echo "rolling-restart: no executable at $bin (--bin PATH)" >&2; exit 2; }
for tool in curl python3 setsid; do
  command -v "$tool" >/dev/null || { echo "rolling-restart: needs $tool" >&2; exit 2; }
done

t_start=${EPOCHREALTIME/./}
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
since() { echo $(( (${EPOCHREALTIME/./} - $1) / 1000 )); }   # ms since a ${EPOCHREALTIME/./}
say() { printf '[%6.1fs] %s\n' "$(( ($(since "$t_start")) ))e-3" "$*"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/rolling-restart.XXXXXX")"
declare -a port pid
declare -a worker_pids=()
problems=()          # what went wrong in the procedure itself (bounds, exit statuses)
problem() { problems+=("$*"); say "PROBLEM: $*"; }

cleanup() {
  local rc=$? p k
  trap - EXIT INT TERM
  disown -a 2>/dev/null   # no "Killed" notices for the processes stopped here
  touch "$work/stop" 2>/dev/null
  # The load first (each worker is a process group of its own: its loop, `fenced exec`
  # and what it runs; exec forwards SIGTERM and releases), then the members.
  for p in "${worker_pids[@]}"; do kill -0 "$p" 2>/dev/null && kill -TERM -- "-$p" 2>/dev/null; done
  for ((k = 0; k < 50; k++)); do
    local alive=0
    for p in "${worker_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${worker_pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
  for k in "${!pid[@]}"; do [ -n "${pid[$k]}" ] && kill -KILL "${pid[$k]}" 2>/dev/null; done
  for ((k = 0; k < 50; k++)); do
    local alive=0
    for p in "${pid[@]}" "${worker_pids[@]}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  if [ $keep -eq 1 ]; then
    echo "rolling-restart: kept $work (members' logs m*/server.log, workers' records w*/, h/)" >&2
  else
    rm -rf "$work"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

setup_failed() { say "SETUP FAILED: $*"; dump_logs; exit 3; }
dump_logs() {
  local i
  for ((i = 1; i <= members; i++)); do
    [ -f "$work/m$i/server.log" ] || continue
    echo "--- member $i, last lines of its log ($work/m$i/server.log):"
    grep -v 'insecure_peers' "$work/m$i/server.log" | tail -n 15 | sed 's/^/    /'
  done
}

# Free loopback ports, taken together so that they differ.
mapfile -t ports < <(python3 -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
for x in s: print(x.getsockname()[1])
for x in s: x.close()' "$members")
peers="" endpoints=""
for ((i = 1; i <= members; i++)); do
  port[$i]=${ports[$((i - 1))]}
  peers+="${peers:+,}$i=http://127.0.0.1:${port[$i]}"
  endpoints+="${endpoints:+,}http://127.0.0.1:${port[$i]}"
  mkdir -p "$work/m$i"
  pid[$i]=""
done
url() { echo "http://127.0.0.1:${port[$1]}"; }

# One member's view of the cluster as "state leader_id commit_index last_applied_index
# [applied_index state_hash]" ("-" for a null), or nothing when it does not answer.
view() {
  curl -s --max-time 2 "$(url "$1")/v1/cluster${2:-}" | python3 -c '
import json, sys
try:
    v = json.load(sys.stdin)
except Exception:
    sys.exit(1)
if "state" not in v:
    sys.exit(1)
f = ["state", "leader_id", "commit_index", "last_applied_index"] + (["applied_index", "state_hash"] if "state_hash" in v else [])
print(" ".join("-" if v.get(k) is None else str(v[k]) for k in f))' 2>/dev/null
}

start_err=""
start_member() {   # in this shell (not in $(...)): it sets pid[$1]; start_err says why not
  local i=$1 k
  echo "=== $(date -u +%FT%T.%3NZ) rolling-restart: start member $i ===" >>"$work/m$i/server.log"
  FENCED_LOG="${FENCED_LOG:-info,openraft=error}" FENCED_SNAPSHOT_ENTRIES="$snapshot_entries" \
    setsid "$bin" server --listen "127.0.0.1:${port[$i]}" --node-id "$i" --peers "$peers" \
    --insecure-peers --data-dir "$work/m$i/data" </dev/null >>"$work/m$i/server.log" 2>&1 &
  pid[$i]=$!
  for ((k = 0; k < 200; k++)); do
    curl -s -o /dev/null --max-time 1 "$(url "$i")/livez" && return 0
    kill -0 "${pid[$i]}" 2>/dev/null || { wait "${pid[$i]}"; start_err="member $i exited $? at start"; pid[$i]=""; return 1; }
    sleep 0.1
  done
  start_err="member $i did not answer /livez within 20 s"
  return 1
}

# Sets `leader` to the member every running member names, once it says it leads
# itself; within $1 seconds.
leader=""
wait_leader() {
  local deadline=$(( $(now_ms) + $1 * 1000 )) i named agree st lid rest
  while :; do
    named="" agree=1
    for ((i = 1; i <= members; i++)); do
      [ -n "${pid[$i]}" ] || continue
      read -r st lid rest <<<"$(view "$i")"
      if [ -z "${lid:-}" ] || [ "$lid" = "-" ]; then agree=0; break; fi
      if [ -z "$named" ]; then named=$lid; elif [ "$named" != "$lid" ]; then agree=0; break; fi
    done
    if [ $agree -eq 1 ] && [ -n "$named" ] && [ -n "${pid[$named]:-}" ]; then
      read -r st rest <<<"$(view "$named")"
      [ "${st:-}" = leader ] && { leader=$named; return 0; }
    fi
    [ "$(now_ms)" -lt $deadline ] || return 1
    sleep 0.1
  done
}

# Member $1 follows a leader (or leads) and has applied the commit index its leader had
# when it first named one; within $2 seconds. Sets `caught_to` and `caught_state`.
caught_to="" caught_state=""
wait_caught_up() {
  local i=$1 deadline=$(( $(now_ms) + $2 * 1000 )) target="" st lid commit applied lst rest
  while :; do
    read -r st lid commit applied rest <<<"$(view "$i")"
    if [[ ${st:-} =~ ^(follower|leader)$ ]] && [[ ${lid:-} =~ ^[0-9]+$ ]] && [ -n "${pid[$lid]:-}" ]; then
      # A member that has just been elected shows a null commit_index until its first
      # commit in the new term: asked again then.
      if [ -z "$target" ]; then
        if [ "$lid" = "$i" ]; then [[ $commit =~ ^[0-9]+$ ]] && target=$commit
        else read -r lst lid commit rest <<<"$(view "$lid")"; [ "${lst:-}" = leader ] && [[ $commit =~ ^[0-9]+$ ]] && target=$commit
        fi
      fi
      if [ -n "$target" ] && [[ $applied =~ ^[0-9]+$ ]] && [ "$applied" -ge "$target" ]; then
        caught_to=$target caught_state=$st
        return 0
      fi
    fi
    [ "$(now_ms)" -lt $deadline ] || { caught_to="${target:-none}, applied ${applied:-none}, state ${st:-none}"; caught_state="(not caught up)"; return 1; }
    sleep 0.1
  done
}

# SIGTERM member $1, wait for its exit (bounded: shutdown_drain_ms is 10 s), start it
# again on the same data directory and port, wait until it has caught up.
restarts=0 leader_restarts=0
restart_member() {
  local i=$1 role=$2 t0 k rc
  t0=${EPOCHREALTIME/./}
  kill -TERM "${pid[$i]}"
  for ((k = 0; k < 1000; k++)); do kill -0 "${pid[$i]}" 2>/dev/null || break; sleep 0.02; done
  if kill -0 "${pid[$i]}" 2>/dev/null; then
    problem "member $i ($role) did not exit within 20 s of SIGTERM; killed"
    kill -KILL "${pid[$i]}"
  fi
  wait "${pid[$i]}"; rc=$?
  pid[$i]=""
  local stop_ms; stop_ms=$(since "$t0")
  [ $rc -eq 0 ] || problem "member $i ($role) exited $rc on SIGTERM (a clean stop exits 0)"
  t0=${EPOCHREALTIME/./}
  start_member "$i" || setup_failed "round $round: $start_err"
  if ! wait_caught_up "$i" 30; then
    problem "member $i did not catch up within 30 s of its start (target $caught_to)"
  fi
  restarts=$((restarts + 1))
  [ "$role" = leader ] && leader_restarts=$((leader_restarts + 1))
  say "round $round: member $i ($role) SIGTERM, exited $rc in ${stop_ms} ms; back as $caught_state, applied index $caught_to after $(since "$t0") ms"
}

# A negative control in place of round 1: $1 = quorum-loss or amnesia.
break_cluster() {
  local i t0 victims=()
  if [ "$1" = quorum-loss ]; then
    victims=("$leader")
    for ((i = 1; i <= members; i++)); do [ "$i" != "$leader" ] && { victims+=("$i"); break; }; done
    # A majority: with 5 members, three.
    for ((i = 1; i <= members && ${#victims[@]} < members / 2 + 1; i++)); do
      [[ " ${victims[*]} " == *" $i "* ]] || victims+=("$i")
    done
  else
    for ((i = 1; i <= members; i++)); do victims+=("$i"); done
  fi
  say "BREAK $1: SIGKILL of members ${victims[*]} at once (leader $leader)"
  exec 4>&2 2>/dev/null   # no "Killed" notices
  for i in "${victims[@]}"; do kill -KILL "${pid[$i]}"; done
  for i in "${victims[@]}"; do wait "${pid[$i]}"; pid[$i]=""; done
  : notices are printed here
  exec 2>&4 4>&-
  if [ "$1" = quorum-loss ]; then
    say "BREAK quorum-loss: members ${victims[*]} stay down for $outage s"
    sleep "$outage"
  else
    for i in "${victims[@]}"; do rm -rf "$work/m$i/data"; done
    say "BREAK amnesia: every data directory deleted"
  fi
  t0=${EPOCHREALTIME/./}
  for i in "${victims[@]}"; do start_member "$i" || setup_failed "break: $start_err"; done
  wait_leader 30 || setup_failed "no leader after the break"
  for i in "${victims[@]}"; do wait_caught_up "$i" 30 || true; restarts=$((restarts + 1)); done
  leader_restarts=$((leader_restarts + 1))
  say "BREAK $1: members ${victims[*]} back after $(since "$t0") ms, leader $leader"
}

# ---- the load -------------------------------------------------------------------------
# Worker w: `fenced exec` cycles on lock roll-lock-w; the command writes the cycle's
# number to key roll-key-w with the lock's token (FENCED_TOKEN) and prints the token.
# The command is given every member's URL (see the top). Records "n token ms" per
# acknowledged cycle in acked, every failed cycle with its stderr in errors, and a
# successful cycle that printed something on stderr in warnings.
worker() {
  local w=$1 n=0 rc t0 ms out dir="$ROLL_WORK/w$1"
  while [ ! -e "$ROLL_WORK/stop" ]; do
    n=$((n + 1))
    t0=${EPOCHREALTIME/./}
    out=$(ROLL_N=$n ROLL_KEY="roll-key-$w" FENCED_ENDPOINT="$ROLL_ENDPOINTS" \
      "$ROLL_BIN" exec --ttl 5s --wait 30s "roll-lock-$w" -- sh -c \
      '"$ROLL_BIN" put "$ROLL_KEY" "$ROLL_N" --token "$FENCED_TOKEN" >/dev/null && echo "token=$FENCED_TOKEN"' \
      2>"$dir/stderr")
    rc=$?
    ms=$(( (${EPOCHREALTIME/./} - t0) / 1000 ))
    if [ $rc -eq 0 ] && [[ $out =~ ^token=([0-9]+)$ ]]; then
      echo "$n ${BASH_REMATCH[1]} $ms" >>"$dir/acked"
      [ -s "$dir/stderr" ] && { echo "worker $w cycle $n (exit 0, $ms ms):"; sed 's/^/    /' "$dir/stderr"; } >>"$dir/warnings"
    else
      { echo "worker $w cycle $n: fenced exec exited $rc after $ms ms (stdout: ${out:-nothing})"
        sed 's/^/    /' "$dir/stderr"; } >>"$dir/errors"
    fi
    echo "$n" >"$dir/cycles"
  done
}

# The holder: `fenced lock roll-held` held for the whole run (its keepalives must fail
# over), and a plain `fenced put` loop writing n to roll-held-key with its token.
holder() {
  local dir="$ROLL_WORK/h" n=0 token="" k rc t0 ms lp view
  trap 'touch "$ROLL_WORK/h/done"' EXIT   # a holder that lost its lock stops; the others go on
  FENCED_ENDPOINT="$ROLL_ENDPOINTS" "$ROLL_BIN" lock roll-held --ttl 5s --wait 30s --json \
    >"$dir/grant" 2>"$dir/lock.stderr" &
  lp=$!
  for ((k = 0; k < 300; k++)); do
    token=$(grep -o '"token":[0-9]*' "$dir/grant" 2>/dev/null | cut -d: -f2)
    [ -n "$token" ] && break
    kill -0 $lp 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$token" ]; then
    { echo "holder: fenced lock printed no grant"; sed 's/^/    /' "$dir/lock.stderr"; } >>"$dir/errors"
    kill -TERM $lp 2>/dev/null
    return
  fi
  echo "$token" >"$dir/token"
  while [ ! -e "$ROLL_WORK/stop" ]; do
    if ! kill -0 $lp 2>/dev/null; then
      wait $lp; rc=$?
      { echo "holder: fenced lock exited $rc while the run went on (3: the lock was lost)"
        sed 's/^/    /' "$dir/lock.stderr"; } >>"$dir/errors"
      return
    fi
    n=$((n + 1))
    t0=${EPOCHREALTIME/./}
    if FENCED_ENDPOINT="$ROLL_ENDPOINTS" "$ROLL_BIN" put roll-held-key "$n" --token "$token" \
      >/dev/null 2>"$dir/stderr"; then
      echo "$n $token $(( (${EPOCHREALTIME/./} - t0) / 1000 ))" >>"$dir/acked"
    else
      rc=$?
      { echo "holder: put $n exited $rc after $(( (${EPOCHREALTIME/./} - t0) / 1000 )) ms"
        sed 's/^/    /' "$dir/stderr"; } >>"$dir/errors"
    fi
    echo "$n" >"$dir/cycles"
    sleep 0.02
  done
  # Still held by this lease, with its token, after every restart.
  view=$(FENCED_ENDPOINT="$ROLL_ENDPOINTS" "$ROLL_BIN" locks --prefix roll-held --json 2>&1)
  python3 -c 'import json,sys
v = [l for l in json.loads(sys.argv[1])["locks"] if l["name"] == "roll-held"]
sys.exit(0 if v and v[0]["held"] and v[0]["token"] == int(sys.argv[2]) else 1)' "$view" "$token" 2>/dev/null ||
    echo "holder: roll-held is not held with token $token at the end: $view" >>"$dir/errors"
  kill -TERM $lp
  wait $lp; rc=$?
  [ $rc -eq 0 ] || { echo "holder: fenced lock exited $rc on SIGTERM at the end (3: the lock was lost)"
    sed 's/^/    /' "$dir/lock.stderr"; } >>"$dir/errors"
}

start_load() {
  local w
  export ROLL_WORK="$work" ROLL_BIN="$bin" ROLL_ENDPOINTS="$endpoints"
  for ((w = 1; w <= workers; w++)); do
    mkdir -p "$work/w$w"; : >"$work/w$w/acked"; echo 0 >"$work/w$w/cycles"
    setsid bash -c "$(declare -f worker); worker $w" </dev/null >>"$work/load.log" 2>&1 &
    worker_pids+=($!)
  done
  mkdir -p "$work/h"; : >"$work/h/acked"; echo 0 >"$work/h/cycles"
  setsid bash -c "$(declare -f holder); holder" </dev/null >>"$work/load.log" 2>&1 &
  worker_pids+=($!)
}
acked() { cat "$work"/w*/acked "$work/h/acked" 2>/dev/null | wc -l; }
# Every worker (and the holder) has acknowledged at least $1 more cycles than in $2
# (a file of counts); within $3 seconds.
progress_snapshot() { local d; for d in "$work"/w* "$work/h"; do wc -l <"$d/acked"; done; }
wait_progress() {
  local need=$1 before=$2 deadline=$(( $(now_ms) + $3 * 1000 )) d k ok
  while :; do
    ok=1 k=0
    for d in "$work"/w* "$work/h"; do
      k=$((k + 1))
      [ -e "$d/done" ] || [ "$(wc -l <"$d/acked")" -ge $(( $(sed -n "${k}p" <<<"$before") + need )) ] || ok=0
    done
    [ $ok -eq 1 ] && return 0
    [ "$(now_ms)" -lt $deadline ] || return 1
    sleep 0.1
  done
}

# ---- the run --------------------------------------------------------------------------
say "fenced rolling restart: $members members, $rounds round(s), $workers exec worker(s) + 1 holder, settle ${settle} s, snapshot every $snapshot_entries entries${breaks:+, BREAK $breaks}; $work"
say "binary $bin ($("$bin" --version 2>/dev/null))"
for ((i = 1; i <= members; i++)); do start_member "$i" || setup_failed "$start_err"; done
wait_leader 30 || setup_failed "no leader agreed within 30 s"
say "cluster up on ports ${port[*]}, leader $leader"

# Sentinels: written once before the first restart, never again.
sentinels=5
FENCED_ENDPOINT="$endpoints" ROLL_BIN="$bin" ROLL_ENDPOINTS="$endpoints" ROLL_SENTINELS=$sentinels \
  "$bin" exec --ttl 5s --wait 30s roll-sentinels -- sh -c '
  for k in $(seq "$ROLL_SENTINELS"); do
    "$ROLL_BIN" put "roll-sentinel-$k" "sentinel-$k-$FENCED_TOKEN" --token "$FENCED_TOKEN" --endpoint "$ROLL_ENDPOINTS" >/dev/null || exit 1
  done
  echo "$FENCED_TOKEN"' >"$work/sentinel-token" 2>"$work/sentinel.stderr" ||
  setup_failed "the sentinel writes failed: $(cat "$work/sentinel.stderr")"
sentinel_token=$(cat "$work/sentinel-token")

start_load
before=$(progress_snapshot)
wait_progress 3 "$before" 60 || setup_failed "the load made no progress before the first restart"
say "load running: $(acked) cycles acknowledged before the first restart"

round=0
for ((round = 1; round <= rounds; round++)); do
  done_here=" " leader_done=0
  if [ "$round" -eq 1 ] && [ -n "$breaks" ]; then
    wait_leader 30 || setup_failed "no leader before the break"
    break_cluster "$breaks"
    sleep "$settle"
    continue
  fi
  for ((step = 1; step <= members; step++)); do
    wait_leader 30 || setup_failed "round $round: no leader agreed within 30 s"
    pick=""
    for ((i = 1; i <= members; i++)); do
      [[ $done_here == *" $i "* ]] || [ "$i" = "$leader" ] || { pick=$i; break; }
    done
    if [ -z "$pick" ]; then pick=$leader; fi
    role=follower; [ "$pick" = "$leader" ] && { role=leader; leader_done=1; }
    restart_member "$pick" "$role"
    done_here+="$pick "
    sleep "$settle"
  done
  # Leadership moved to a member restarted earlier in this round: restart the leader too.
  if [ $leader_done -eq 0 ]; then
    wait_leader 30 || setup_failed "round $round: no leader agreed within 30 s"
    restart_member "$leader" leader
    sleep "$settle"
  fi
done

# The load goes on after the last restart, then stops.
before=$(progress_snapshot)
wait_progress 3 "$before" 60 || problem "the load did not make progress within 60 s of the last restart"
wait_leader 30 || problem "no leader agreed within 30 s after the last restart"
touch "$work/stop"
say "load stopping"
# A cycle ends within its bounds (an acquire waits at most --wait 30 s plus the 10 s
# request time-out), so all of them within 60 s.
deadline=$(( $(now_ms) + 60000 ))
for p in "${worker_pids[@]}"; do
  while kill -0 "$p" 2>/dev/null && [ "$(now_ms)" -lt $deadline ]; do sleep 0.1; done
  kill -0 "$p" 2>/dev/null && problem "a load worker did not stop within 60 s"
done
wait "${worker_pids[@]}" 2>/dev/null
worker_pids=()

# ---- the checks -----------------------------------------------------------------------
fails=()
fail() { fails+=("$1"); echo "FAIL $1"; }
get() { FENCED_ENDPOINT="$endpoints" "$bin" get "$1" 2>&1; }

errors=0 warnings=0 cycles=0 lost=0 maxms=0 line=""
for ((w = 1; w <= workers; w++)); do
  d="$work/w$w"
  e=$(grep -c '^worker ' "$d/errors" 2>/dev/null); e=${e:-0}
  wn=$(grep -c '^worker ' "$d/warnings" 2>/dev/null); wn=${wn:-0}
  a=$(wc -l <"$d/acked")
  errors=$((errors + e)) warnings=$((warnings + wn)) cycles=$((cycles + a))
  m=$(awk '$3 > m { m = $3 } END { print m + 0 }' "$d/acked")
  [ "$m" -gt "$maxms" ] && maxms=$m
  # Tokens strictly increasing in the order the worker saw its cycles acknowledged.
  bad=$(awk 'NR > 1 && $2 <= t { print "cycle " $1 " token " $2 " after " t; exit } { t = $2 }' "$d/acked")
  [ -z "$bad" ] || fail "tokens: worker $w got a token that did not go up: $bad"
  last=$(tail -n 1 "$d/acked" | cut -d' ' -f1)
  if [ -n "$last" ]; then
    v=$(get "roll-key-$w")
    if ! [[ $v =~ ^[0-9]+$ ]] || [ "$v" -lt "$last" ]; then
      lost=$((lost + 1))
      fail "lost: roll-key-$w holds '$v', its last acknowledged write was $last"
    fi
  else
    v="-"
  fi
  [ "$a" -ge 1 ] || fail "cycles: worker $w had no cycle acknowledged"
  line+=" w$w=$a"
  say "worker $w: $(cat "$d/cycles") cycles, $a acknowledged, $e errors, $wn warnings, slowest cycle $m ms, roll-key-$w = $v (last acknowledged ${last:-none})"
done
dup=$(cat "$work"/w*/acked | cut -d' ' -f2 | sort -n | uniq -d | head -n 3 | tr '\n' ' ')
[ -z "$dup" ] || fail "tokens: granted twice: $dup"

hd="$work/h"
he=$(grep -c '^holder' "$hd/errors" 2>/dev/null); he=${he:-0}
ha=$(wc -l <"$hd/acked"); hlast=$(tail -n 1 "$hd/acked" | cut -d' ' -f1)
errors=$((errors + he))
hm=$(awk '$3 > m { m = $3 } END { print m + 0 }' "$hd/acked")
if [ -n "$hlast" ]; then
  v=$(get roll-held-key)
  if ! [[ $v =~ ^[0-9]+$ ]] || [ "$v" -lt "$hlast" ]; then
    lost=$((lost + 1)); fail "lost: roll-held-key holds '$v', its last acknowledged write was $hlast"
  fi
else
  v="-"; fail "cycles: the holder's put loop had no write acknowledged"
fi
say "holder: lock roll-held token $(cat "$hd/token" 2>/dev/null || echo none), $ha puts acknowledged, $he errors, slowest put $hm ms, roll-held-key = $v (last acknowledged ${hlast:-none})"

for ((k = 1; k <= sentinels; k++)); do
  v=$(get "roll-sentinel-$k")
  [ "$v" = "sentinel-$k-$sentinel_token" ] || { lost=$((lost + 1)); fail "lost: roll-sentinel-$k holds '$v', not sentinel-$k-$sentinel_token"; }
done

if [ $errors -gt 0 ]; then
  fail "errors: $errors calls failed (a library caller would have seen them); the first ones:"
  cat "$work"/w*/errors "$hd/errors" 2>/dev/null | head -n 24 | sed 's/^/    /'
fi
if [ $warnings -gt 0 ]; then
  say "$warnings acknowledged cycles printed something on stderr; the first ones:"
  cat "$work"/w*/warnings | head -n 12 | sed 's/^/    /'
fi
for p in "${problems[@]}"; do fail "procedure: $p"; done
[ $leader_restarts -ge $rounds ] || fail "procedure: the leader was restarted $leader_restarts times in $rounds rounds"

# What the load left behind: every cycle released its lock and its lease, so nothing
# should be left but what a lost answer may have left until its TTL runs out.
wait_leader 10 || true
left=$(curl -s --max-time 2 "$(url "${leader:-1}")/metrics" | awk '$1 == "fenced_leases" || $1 == "fenced_locks" { printf "%s=%s ", $1, $2 }')
say "after the load (leader ${leader:-?}): ${left:-no metrics}$(FENCED_ENDPOINT="$endpoints" "$bin" locks 2>&1 | head -n 5 | tr '\n' ';')"

# Every member holds the same state: the same state_hash at the same applied_index (the
# log may still move, so asked again until they stand at one index, within 20 s).
agree=""
deadline=$(( $(now_ms) + 20000 ))
while :; do
  digests=()
  for ((i = 1; i <= members; i++)); do
    read -r st lid commit applied ai hash <<<"$(view "$i" '?digest=true')"
    digests+=("${ai:-none}:${hash:-none}")
  done
  idx=$(printf '%s\n' "${digests[@]}" | cut -d: -f1 | sort -u)
  if [ "$(wc -l <<<"$idx")" -eq 1 ] && [ "$idx" != none ]; then
    if [ "$(printf '%s\n' "${digests[@]}" | sort -u | wc -l)" -eq 1 ]; then
      agree="state_hash ${digests[0]#*:} at applied index $idx"
    else
      fail "replicas: the members disagree at applied index $idx: ${digests[*]}"
      agree="DISAGREE"
    fi
    break
  fi
  if [ "$(now_ms)" -ge $deadline ]; then
    fail "replicas: the members never stood at one applied index within 20 s: ${digests[*]}"
    agree="never at one index"
    break
  fi
  sleep 0.05
done
say "members: ${agree} (asked for $(( (20000 - deadline + $(now_ms)) )) ms)"

secs=$(( $(since "$t_start") / 1000 ))
summary="rounds=$rounds restarts=$restarts leader_restarts=$leader_restarts cycles=$cycles (${line# }) puts=$ha errors=$errors lost=$lost slowest_cycle_ms=$maxms time=${secs}s"
if [ ${#fails[@]} -eq 0 ]; then
  echo "rolling-restart: OK $summary"
  exit 0
fi
dump_logs
checks=$(printf '%s\n' "${fails[@]}" | cut -d: -f1 | sort -u | tr '\n' ',' | sed 's/,$//')
echo "rolling-restart: FAIL ($checks) $summary"
exit 1
