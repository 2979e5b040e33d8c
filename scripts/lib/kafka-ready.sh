#!/usr/bin/env bash
# kafka-ready.sh [PORT [CLIENT_PROPERTIES]]: exit 0 when the broker at 127.0.0.1:PORT
# (default TAILGUARD_KAFKA_PORT) answers a metadata request with the kafka-clients admin
# tool bundled in the jars (no Python needed); CLIENT_PROPERTIES for a secured listener.
source "$(dirname "$0")/common.sh"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$TAILGUARD_ROOT/scripts/kafka-deps/pom.xml")"
timeout 20 java -Dlog4j2.configurationFile="$TAILGUARD_ROOT/scripts/kafka-deps/log4j2.properties" \
  -cp "$TAILGUARD_CACHE/kafka-$KAFKA_VERSION/libs/*" org.apache.kafka.tools.BrokerApiVersionsCommand \
  --bootstrap-server "127.0.0.1:${1:-$TAILGUARD_KAFKA_PORT}" ${2:+--command-config "$2"} >/dev/null 2>&1
