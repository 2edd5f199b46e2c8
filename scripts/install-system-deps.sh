#!/usr/bin/env bash
# Debian packages the test suite starts for real: redis-server, prometheus (+ promtool).
# Idempotent: installs only what is missing, running apt-get update at most once.
set -euo pipefail

declare -A needs=([redis-server]=redis-server [prometheus]=prometheus [promtool]=prometheus)
missing=()
for cmd in "${!needs[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${needs[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing Debian packages: ${packages[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}"
