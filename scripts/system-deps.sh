#!/usr/bin/env bash
# Install the real Prometheus tools the test suite drives (promtool, prometheus, amtool,
# alertmanager), jsonnetfmt, and node/npm from Debian's packages, once. Fast no-op when they are already there.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v jsonnetfmt >/dev/null 2>&1 || need+=(jsonnet)
# node and npm: tests/mixin/test_grafana_schema.py types the dashboards with TypeScript against
# Grafana's @grafana/schema (npm packages pinned in tests/grafana-schema/package-lock.json).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "specwatch setup: need Debian packages ${need[*]} (promtool, amtool); run as root: apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi
echo "specwatch setup: installing Debian packages: ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# The suite never uses the packages' services: tests start their own servers on free ports.
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
