# A second local user for the security tests (tests/second_user.py): they run their
# attacks as this user, who must not reach a cluster's processes. Sourced by .ci/run
# (bash, set -euo pipefail); also runnable on its own, and idempotent.

if ! id -u monarchnb-other >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin monarchnb-other
fi
