#!/usr/bin/env python3
"""Writes lines of files to a Kafka topic with a real client (confluent-kafka, librdkafka):
the other producer of the Kafka process tests (tests/kafka_formats.rs).

Usage: kafka_producer.py BROKER TOPIC [--interleave] STEP...

Each STEP is KIND:CODEC:FILE: every line of FILE becomes one record, written round robin over
the topic's partitions with compression.type CODEC (none, gzip, snappy, lz4, zstd) by a
producer of its own. KIND is `plain` (no transaction), `commit` or `abort` (one transaction,
committed or aborted; its records are flushed to the broker before it ends, so an aborted
transaction's records are in the log). With --interleave every step writes its records first
and the transactions end afterwards, in step order: their records and markers interleave in
the log. Prints one JSON line: the records each step delivered.
"""

import json
import sys

from confluent_kafka import KafkaException, Producer


def main(argv):
    interleave = "--interleave" in argv
    args = [a for a in argv if a != "--interleave"]
    if len(args) < 3:
        sys.exit(__doc__)
    broker, topic, steps = args[0], args[1], args[2:]
    delivered = [0] * len(steps)
    failed = []
    open_txns = []
    for i, step in enumerate(steps):
        kind, codec, path = step.split(":", 2)
        if kind not in ("plain", "commit", "abort"):
            sys.exit(f"{step}: expected plain, commit or abort")
        conf = {
            "bootstrap.servers": broker,
            "compression.type": codec,
            # Many records per batch, so each codec compresses real batches.
            "linger.ms": 20,
            "batch.num.messages": 500,
        }
        if kind != "plain":
            conf["transactional.id"] = f"sparta-test-{i}"
        p = Producer(conf)
        partitions = len(p.list_topics(topic, timeout=30).topics[topic].partitions)

        def report(err, _msg, i=i):
            if err is None:
                delivered[i] += 1
            else:
                failed.append(str(err))

        if kind != "plain":
            p.init_transactions(30)
            p.begin_transaction()
        with open(path, "rb") as f:
            for n, line in enumerate(f):
                line = line.rstrip(b"\n")
                if not line:
                    continue
                while True:
                    try:
                        p.produce(topic, line, partition=n % partitions, on_delivery=report)
                        break
                    except BufferError:
                        p.poll(0.1)
        if p.flush(60) != 0:
            sys.exit(f"{step}: records left unsent")
        if kind == "plain":
            continue
        if interleave:
            open_txns.append((kind, p))
        else:
            end(kind, p)
    for kind, p in open_txns:
        end(kind, p)
    if failed:
        sys.exit(f"delivery failed: {failed[:3]}")
    print(json.dumps({"delivered": delivered}))


def end(kind, p):
    try:
        if kind == "commit":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    except KafkaException as e:
        sys.exit(f"ending a transaction ({kind}): {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
