#!/usr/bin/env bash
# CI for the TypeScript client, called from the repository root: installs the pinned
# dev dependencies (typescript, @types/node) from package-lock.json, compiles, and runs
# the tests against the server binary (FENCED_BIN, default target/release/fenced; under
# CI=true a missing binary fails the run). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null || { echo "ci.sh: node is not installed (Node 20 or later is needed)" >&2; exit 1; }
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 20 ] || { echo "ci.sh: node $(node --version) is too old: Node 20 or later is needed" >&2; exit 1; }
npm ci --no-audit --no-fund
# Every test is bounded (--test-timeout in package.json); so is the whole run.
timeout 300 npm test
