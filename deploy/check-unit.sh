#!/usr/bin/env bash
# The systemd unit and its example configuration, checked without systemd running:
#
#   deploy/check-unit.sh [FENCED_BIN]       # or FENCED_BIN=... deploy/check-unit.sh
#
# - `systemd-analyze verify` of deploy/systemd/fenced.service. verify insists that
#   ExecStart's binary exists, and on a build machine /usr/local/bin/fenced is not
#   installed: so it verifies a copy whose ExecStart names the built binary instead, the
#   only line changed (checked). verify exits 0 on an unknown key or a bad value and
#   only prints a warning, so any output fails the check.
# - `systemd-analyze security --offline=true`: the unit's exposure must stay at most 2.0.
# - deploy/systemd/fenced.toml loads in the binary (`--print-config`), every key it shows
#   commented out included, and names the unit's StateDirectory as data_dir.
# Each check has a negative control: a copy with an unknown key, a bad value, a missing
# binary, the hardening removed, a config with an unknown key must each be refused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
unit="$here/systemd/fenced.service"
toml="$here/systemd/fenced.toml"
bin="${1:-${FENCED_BIN:-}}"
[ -n "$bin" ] || { echo "usage: $0 FENCED_BIN (or set FENCED_BIN)" >&2; exit 2; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
[ -x "$bin" ] || { echo "FAIL $bin is not an executable" >&2; exit 1; }
command -v systemd-analyze >/dev/null || { echo "FAIL systemd-analyze not installed" >&2; exit 1; }
# The binary reads FENCED_* variables as configuration: none from here may change what
# the example configuration is checked as.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^FENCED_' || true)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*" >&2; exit 1; }

# verify: empty output and status 0, or the unit at $1 is refused.
verify() {
  local out rc=0
  out="$(timeout 20 systemd-analyze verify --man=no "$1" 2>&1)" || rc=$?
  [ "$rc" -eq 0 ] && [ -z "$out" ] && return 0
  printf '%s\n' "$out" >&2
  return 1
}

# The copy to verify (a unit file's name is its unit's: keep fenced.service).
mkdir "$tmp/ok" "$tmp/bad"
sed "s#^ExecStart=/usr/local/bin/fenced #ExecStart=$bin #" "$unit" >"$tmp/ok/fenced.service"
changed="$(diff "$unit" "$tmp/ok/fenced.service" | grep -c '^[<>]' || true)"
[ "$changed" = 2 ] || fail "the copy to verify differs from the unit in more than ExecStart ($changed lines)"
grep -qx "ExecStart=$bin server --config /etc/fenced/fenced.toml" "$tmp/ok/fenced.service" ||
  fail "ExecStart is not '/usr/local/bin/fenced server --config /etc/fenced/fenced.toml'"
verify "$tmp/ok/fenced.service" || fail "systemd-analyze verify of $unit (ExecStart=$bin)"

# Its negative controls.
sed 's/^Type=notify$/Type=notify\nBogusKey=1/' "$tmp/ok/fenced.service" >"$tmp/bad/fenced.service"
verify "$tmp/bad/fenced.service" 2>/dev/null && fail "verify passed a unit with an unknown key"
sed 's/^Type=notify$/Type=notfy/' "$tmp/ok/fenced.service" >"$tmp/bad/fenced.service"
verify "$tmp/bad/fenced.service" 2>/dev/null && fail "verify passed a unit with a bad Type="
sed "s#^ExecStart=$bin #ExecStart=$tmp/absent/fenced #" "$tmp/ok/fenced.service" >"$tmp/bad/fenced.service"
verify "$tmp/bad/fenced.service" 2>/dev/null && fail "verify passed a unit whose binary is missing"

# The exposure (0 to 10; --threshold counts tenths).
exposure() { timeout 20 systemd-analyze security --offline=true --threshold=20 "$1" >"$tmp/security.txt" 2>&1; }
exposure "$tmp/ok/fenced.service" || { cat "$tmp/security.txt" >&2; fail "exposure over 2.0"; }
level="$(grep -o 'Overall exposure level for fenced.service: [0-9.]*' "$tmp/security.txt" | grep -o '[0-9.]*$')"
sed '/^# Hardening/,/^\[Install\]/{/^\[Install\]/!d}' "$tmp/ok/fenced.service" >"$tmp/bad/fenced.service"
exposure "$tmp/bad/fenced.service" && fail "the exposure check passed the unit without its hardening"

# The example configuration, as the binary reads it.
grep -q '^StateDirectory=fenced$' "$unit" || fail "the unit has no StateDirectory=fenced"
"$bin" server --config "$toml" --print-config >"$tmp/config.txt" 2>&1 ||
  { cat "$tmp/config.txt" >&2; fail "$toml does not load"; }
grep -qx 'data_dir = "/var/lib/fenced"' "$tmp/config.txt" || fail "$toml: data_dir is not /var/lib/fenced"
sed 's/^#\([a-z_]* = \)/\1/' "$toml" >"$tmp/all.toml"
"$bin" server --config "$tmp/all.toml" --print-config >"$tmp/config.txt" 2>&1 ||
  { cat "$tmp/config.txt" >&2; fail "$toml with its commented keys set does not load"; }
printf 'data_dir = "/var/lib/fenced"\nno_such_setting = 1\n' >"$tmp/bad.toml"
rc=0; "$bin" server --config "$tmp/bad.toml" --print-config >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "a config with an unknown key was not refused (status $rc)"

echo "ok: systemd-analyze verify clean (ExecStart=$bin), exposure $level, fenced.toml loads; 6 negative controls refused"
