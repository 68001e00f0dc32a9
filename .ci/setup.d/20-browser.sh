# A headless browser for tests/test_health_browser.py: Debian's chromium and its
# chromedriver (Selenium drives them; nothing is downloaded from elsewhere). Sourced by
# .ci/run (bash, set -euo pipefail); also runnable on its own, and idempotent.

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            chromium chromium-driver >/dev/null; then
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            chromium chromium-driver >/dev/null
    fi
fi
mkdir -p .ci/artifacts  # the browser test's screenshot lands here
