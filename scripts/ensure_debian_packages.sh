#!/usr/bin/env bash
# The Debian packages the tests drive for real, installed when missing. Run by `make test` (and so
# by CI's .ci/run):
# - chromium: the browser test (tests/integration/test_ui_browser.py) drives /usr/bin/chromium with
#   Playwright, which never downloads a browser of its own (there may be no network for that);
# - postgresql: a throwaway cluster on 127.0.0.1 holds an Optuna study (tests/helpers/postgres.py);
# - openjdk-17-jre-headless: `java` for the Spark Connect server that validation.engine spark runs on
#   (tests/helpers/spark_connect.py; pyspark's wheel carries the server's jars, not a JVM).
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql)
command -v java > /dev/null || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ] || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo > /dev/null; then
    sudo=(sudo)
else
    echo "ensure_debian_packages: ${missing[*]} missing and installing needs root or sudo (apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "installing Debian's ${missing[*]} for the tests ..." >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
