# `ip` (iproute2) for tests/test_multihost.py, which makes network namespaces and veth
# pairs (and removes them). Sourced by .ci/run (bash, set -euo pipefail); idempotent.

if ! command -v ip >/dev/null; then
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 >/dev/null; then
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 >/dev/null
    fi
fi
