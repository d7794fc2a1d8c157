#!/usr/bin/env python3
"""Peer baseline: the same Wide&Deep in TensorFlow/Keras, timed on data already parsed in memory.

Model as in Sparta's `wdl`: wide = one weight per (field, value) summed + bias; deep = 26 fields x
dim 16 embeddings concatenated with log(1+x) of the 13 integers -> 512-256-128 ReLU -> 1 logit;
output = wide + deep; BCE averaged over the batch. Sparse: Adagrad lr 0.05 (initial accumulator
0.1), dense: Adam 1e-3, batch 4096. Ids are vocabulary indices built from the training rows (the
dense-table layout Keras needs), so this is the peers' fastest setting, not a hash table.

    pip install tensorflow-cpu numpy
    python3 bench/peers/keras_wdl.py --train train.tsv --rows 200000 --threads 2
"""
import argparse
import time

import numpy as np


def load(path, rows):
    labels, dense, cats = [], [], []
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i >= rows:
                break
            p = line.rstrip(b"\n").split(b"\t")
            labels.append(float(p[0]))
            d = [float(x) if x else 0.0 for x in p[1:14]]
            dense.append([np.sign(x) * np.log1p(abs(x)) for x in d])
            cats.append(p[14:40])
    vocab = [dict() for _ in range(26)]
    ids = np.zeros((len(cats), 26), dtype=np.int32)
    for r, row in enumerate(cats):
        for f, v in enumerate(row):
            ids[r, f] = vocab[f].setdefault(v, len(vocab[f]))
    offsets = np.cumsum([0] + [len(v) for v in vocab[:-1]]).astype(np.int32)
    return (np.array(labels, np.float32), np.array(dense, np.float32), ids + offsets,
            sum(len(v) for v in vocab))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    t0 = time.time()
    y, x_dense, ids, n_ids = load(a.train, a.rows)
    print(f"parsed {len(y)} rows, {n_ids} ids in {time.time() - t0:.1f}s", flush=True)

    emb = tf.Variable(tf.random.uniform([n_ids, 16], -0.05, 0.05))
    wide = tf.Variable(tf.zeros([n_ids, 1]))
    bias = tf.Variable(tf.zeros([1]))
    mlp = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu"),
                               tf.keras.layers.Dense(256, activation="relu"),
                               tf.keras.layers.Dense(128, activation="relu"),
                               tf.keras.layers.Dense(1)])
    mlp.build((None, 26 * 16 + 13))
    sparse_opt = tf.keras.optimizers.Adagrad(0.05, initial_accumulator_value=0.1)
    dense_opt = tf.keras.optimizers.Adam(1e-3)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function(jit_compile=False)
    def step(ids_b, dense_b, y_b):
        with tf.GradientTape() as tape:
            e = tf.reshape(tf.gather(emb, ids_b), [-1, 26 * 16])
            w = tf.reduce_sum(tf.gather(wide, ids_b), axis=[1, 2])
            logit = tf.squeeze(mlp(tf.concat([e, dense_b], 1)), 1) + w + bias
            loss = bce(y_b, logit)
        dv = mlp.trainable_variables + [bias]
        g = tape.gradient(loss, [emb, wide] + dv)
        sparse_opt.apply_gradients(zip(g[:2], [emb, wide]))
        dense_opt.apply_gradients(zip(g[2:], dv))
        return loss

    n = len(y) // a.batch * a.batch
    batches = [(tf.constant(ids[i:i + a.batch]), tf.constant(x_dense[i:i + a.batch]),
                tf.constant(y[i:i + a.batch])) for i in range(0, n, a.batch)]
    step(*batches[0])  # trace
    t0 = time.time()
    for b in batches[1:]:
        loss = step(*b)
    secs = time.time() - t0
    rows = n - a.batch
    print(f"keras wdl: {rows} rows in {secs:.2f}s = {rows / secs:.0f} samples/s "
          f"({a.threads} threads), last loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
