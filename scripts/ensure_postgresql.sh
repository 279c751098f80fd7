#!/usr/bin/env bash
# The tests that need PostgreSQL (the Optuna study storage) start a throwaway cluster with Debian's
# postgresql (tests/helpers/postgres.py): install the package when it is missing. Run by `make test`.
set -euo pipefail
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null && exit 0
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo > /dev/null; then
    sudo=(sudo)
else
    echo "ensure_postgresql: Debian's postgresql is missing and installing it needs root or sudo (apt-get install postgresql)" >&2
    exit 1
fi
echo "installing Debian's postgresql for the study-storage test ..." >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
