#!/usr/bin/env bash
# Prerequisites of the verify-imports tests: skopeo (registry references),
# docker-registry (a real registry on 127.0.0.1), bubblewrap (--execute),
# apache2-utils (htpasswd for the registry's basic auth), umoci (the Debian
# images of tests/debian_images.py: layouts, configs, unpacked bundles).
# Idempotent; needs root for apt-get. Call from .ci/setup.
set -euo pipefail
need=()
command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
if [ ${#need[@]} -eq 0 ]; then
  exit 0  # all present: nothing to say (.ci/setup is a quiet no-op then)
fi
if [ "$(id -u)" != 0 ]; then
  echo "imports_env: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# --no-install-recommends: docker-registry must not pull a docker engine or start services
apt-get install -y -qq --no-install-recommends "${need[@]}"
# Debian's docker-registry package starts a system service on :5000; the tests run their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
  systemctl stop docker-registry || true
fi
echo "imports_env: installed ${need[*]}"
