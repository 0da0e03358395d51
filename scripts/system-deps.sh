#!/usr/bin/env bash
# Installs the system packages emqfast needs when they are missing:
# redis-server (tests, demo, embedded default), libssl-dev (TLS in the C core, which
# compiles its own hiredis from csrc/vendor),
# chromium + chromium-driver (the dashboard's browser tests).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the TLS test makes its own CA
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc)
# the dashboard's browser tests (selenium drives Debian's chromium headless)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
