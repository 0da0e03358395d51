#!/usr/bin/env bash
# The Python matrix: for every CPython the package claims (pyproject:
# requires-python >= 3.9, so 3.9 ... 3.13) that this machine has, in sequence: a fresh
# venv, the package installed from a snapshot of this tree with its C core required
# (EMQFAST_REQUIRE_C=1: hiredis compiled in, TLS), then a compat subset of the suite on
# both backends (COMPAT below: every Lua script, C/Python parity, the worker, TLS on C).
#
# Interpreters come from pyenv (`pyenv root`/versions/3.X.*) or python3.X on PATH. A
# missing one is SKIPPED, loudly: Python builds are not downloaded (only package
# registries are used here, and none carries CPython builds). PYMATRIX_REQUIRE=1 turns a
# skip into a failure. PYMATRIX_VERSIONS="3.9 3.13" runs a subset; PYMATRIX_PYTEST_ARGS
# replaces pytest's "-x" (e.g. "" to see every failure).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSIONS=${PYMATRIX_VERSIONS:-"3.9 3.10 3.11 3.12 3.13"}
WORK=${PYMATRIX_DIR:-$ROOT/build/pymatrix}

# ~220 tests: each Lua script runs at least once, most tests on both backends.
COMPAT=(
  tests/test_parity.py
  tests/test_engine_enqueue.py
  tests/test_engine_retry.py
  tests/test_engine_fence.py
  tests/test_engine_payloads.py
  tests/test_engine_worker.py
  tests/test_promote_script.py
  tests/test_tls_c.py
  tests/test_groups.py::test_cancel_removes_a_grouped_job_from_its_lane
  tests/test_groups.py::test_bad_concurrency_is_a_typed_error_and_writes_nothing
  tests/test_groups.py::test_promoted_grouped_job_rejoins_its_lane
  tests/test_groups.py::test_retry_of_a_failed_grouped_job_goes_to_its_lane
  tests/test_groups.py::test_group_cap_holds_across_two_workers
  tests/test_group_rate_limit.py::test_a_full_group_window_is_skipped_and_its_opening_marked
  tests/test_group_rate_limit.py::test_counts_include_jobs_waiting_in_group_lanes
  tests/test_schedules.py::test_get_list_remove
  tests/test_schedules.py::test_jobs_minted_by_schedules_are_ordinary_jobs
  tests/test_schedules.py::test_upsert_same_cadence_updates_options_in_place
  tests/test_schedules.py::test_missed_runs_catch_up_mints_every_missed_occurrence
  tests/test_observability.py::test_progress_is_lease_checked_and_json_only
  # the asyncio Worker: its cancellation bookkeeping differs before 3.11 (aio/cancels.py)
  tests/test_aio_worker.py
  tests/test_aio_lifecycle.py
  # where dependencies, cancel, waits and the finish hook meet
  tests/test_flow_edges.py
  tests/test_finish_hook.py
  tests/test_multi_queue_order.py
  tests/test_cancel_running.py::test_an_async_handler_task_is_cancelled
)

TEST_TOOLS=("pytest>=7" "hypothesis>=6" "pytest-timeout>=2")

find_python() {  # $1 = 3.X -> path of an interpreter of that version, or nothing
  local v=$1 root cand
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for cand in $(ls -d "$root/versions/$v".* 2>/dev/null | sort -V -r) ; do
    [ -x "$cand/bin/python$v" ] && { echo "$cand/bin/python$v"; return; }
  done
  cand=$(command -v "python$v" 2>/dev/null) || return 0
  "$cand" -c 'import sys' >/dev/null 2>&1 && echo "$cand"  # a pyenv shim may not run
}

# A snapshot of the tree (tests included): every version installs and tests the same
# files, and nothing is built inside the shared work tree.
rm -rf "$WORK" && mkdir -p "$WORK/src"
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
  --exclude=./.mypy_cache --exclude=./.hypothesis --exclude=./.benchmarks \
  --exclude='*.so' --exclude=__pycache__ --exclude='*.egg-info' -cf - . | tar -C "$WORK/src" -xf -

# pyproject's [build-system] requires, e.g. setuptools>=68 wheel cffi>=1.15
read -r -a BUILD_REQS < <(sed -n 's/^requires = \[\(.*\)\]$/\1/p' "$WORK/src/pyproject.toml" \
  | tr -d '",')
[ ${#BUILD_REQS[@]} -gt 0 ] || { echo "pymatrix: no [build-system] requires found" >&2; exit 1; }

passed=() failed=() skipped=()
for v in $VERSIONS; do
  py=$(find_python "$v")
  if [ -z "$py" ]; then
    echo "!!! pymatrix: Python $v SKIPPED: no interpreter (pyenv or python$v on PATH)" >&2
    skipped+=("$v"); continue
  fi
  start=$SECONDS
  venv="$WORK/venv-$v" log="$WORK/$v.log"
  echo "=== pymatrix: Python $v ($py)"
  # The build requirements first, then the package without an isolated build env (the
  # same tools, installed once instead of twice), with the test tools the subset uses (not
  # the whole [test] extra: the dashboard's browser stack is not in the subset).
  if ! { "$py" -m venv "$venv" && "$venv/bin/python" -m pip install -q "${BUILD_REQS[@]}" \
         && EMQFAST_REQUIRE_C=1 "$venv/bin/python" -m pip install -q --no-build-isolation \
           "$WORK/src" "${TEST_TOOLS[@]}"; } \
       >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -30 >&2
    echo "!!! pymatrix: Python $v FAILED to install (log: $log)" >&2
    failed+=("$v"); continue
  fi
  # From outside the snapshot: the installed package is imported, never the source copy.
  if (cd "$WORK" && EMQ_REQUIRE_C=1 EMQFAST_REQUIRE_C=1 "$venv/bin/python" -c \
        'import emqfast, sys; assert emqfast.backend() == "c", emqfast.backend(); assert "site-packages" in emqfast.__file__' \
      && EMQ_REQUIRE_C=1 "$venv/bin/python" -m pytest -p no:cacheprovider -q ${PYMATRIX_PYTEST_ARGS--x} \
        --rootdir "$WORK/src" "${COMPAT[@]/#/$WORK/src/}"); then
    echo "=== pymatrix: Python $v passed in $((SECONDS - start))s"
    passed+=("$v")
  else
    echo "!!! pymatrix: Python $v FAILED after $((SECONDS - start))s" >&2
    failed+=("$v")
  fi
done

echo "pymatrix: passed: ${passed[*]:-none}; failed: ${failed[*]:-none};" \
  "skipped: ${skipped[*]:-none} (${SECONDS}s)"
[ ${#failed[@]} -eq 0 ] || exit 1
if [ ${#skipped[@]} -gt 0 ] && [ "${PYMATRIX_REQUIRE:-0}" = 1 ]; then exit 1; fi
