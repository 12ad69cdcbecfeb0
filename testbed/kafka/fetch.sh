#!/usr/bin/env bash
# Fetches the Kafka broker and console tools (Maven Central, about 55 MB) into libs/ next to
# this script, once; the Kafka tests start and stop a broker from them.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f libs/.complete ] && [ libs/.complete -nt pom.xml ]; then
    exit 0
fi
rm -rf libs
mvn -q -B dependency:copy-dependencies -DoutputDirectory=libs
touch libs/.complete
