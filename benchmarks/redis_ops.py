"""Redis table ops: keys/s of insert, lookup, accum and remove in batches of 64k keys at
dims 8 and 64, ours (de.RedisTable) beside TFRA's RedisTable against one local
redis-server, plus end-to-end training examples/s of a Redis-backed variable against
the in-memory table.

    python benchmarks/redis_ops.py [--tfra-python /path/to/venv-with-tfra/bin/python]

The parent starts a redis-server (no persistence) on a free port and runs each side
in its own child process (TFRA needs TF 2.16, so its child may use another
interpreter: --tfra-python, default $DYNEMB_TFRA_PYTHON). Each op is timed over
--batches batches of --batch keys, --repeats times per child, in --rounds rounds that
alternate the two sides; medians are reported, with the ratio ours / TFRA per op (goal:
>= 1.5x), and the CPU seconds per second of the redis-server and of each client during
each op (a server near 1.0 bounds both clients alike). TFRA's accum needs its Redis module
(HMACCUM), which a stock server lacks: reported as n/a.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _harness import loadavg, median, print_result, spawn_child  # noqa: E402

OPS = ("insert", "lookup", "accum", "remove")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_ops(args) -> None:
    """One side's table ops (ours, or TFRA with --tfra)."""
    import numpy as np
    import tensorflow as tf

    if args.tfra:
        from tensorflow_recommenders_addons import dynamic_embedding as de
    else:
        import tensorflow_dynemb as de
    rng = np.random.default_rng(0)
    results = {}
    for dim in args.dims:
        keys = [tf.constant(rng.integers(0, 2**62, args.batch), tf.int64) for _ in range(args.batches)]
        values = [tf.constant(rng.random((args.batch, dim), np.float32)) for _ in range(args.batches)]
        exists = tf.ones([args.batch], tf.bool)
        config = de.RedisTableConfig(redis_config_abs_dir=args.config)
        table = de.RedisTable(tf.int64, tf.float32, tf.zeros([dim]), name=f"bench_{dim}",
                              config=config)
        ops = {
            "insert": lambda i: table.insert(keys[i], values[i]),
            "lookup": lambda i: table.lookup(keys[i]),
            "accum": lambda i: table.accum(keys[i], values[i], exists),
            "remove": lambda i: table.remove(keys[i]),
        }
        per_op = {op: [] for op in OPS}
        # Where the time goes: the redis-server's and this client's CPU seconds per
        # second of the op (1.0: a core busy throughout).
        busy = {op: {"server": [], "client": []} for op in OPS}
        for _ in range(args.repeats):
            table.clear()
            for op in OPS:  # remove last: every pass starts from the inserted rows
                try:
                    server_start, client_start = cpu_seconds(args.server_pid), time.process_time()
                    start = time.perf_counter()
                    for i in range(args.batches):
                        out = ops[op](i)
                    if out is not None and hasattr(out, "numpy"):
                        out.numpy()
                    seconds = time.perf_counter() - start
                    per_op[op].append(args.batch * args.batches / seconds)
                    busy[op]["server"].append((cpu_seconds(args.server_pid) - server_start) / seconds)
                    busy[op]["client"].append((time.process_time() - client_start) / seconds)
                # TFRA's accum without its Redis module: an OpError, or (TFRA 0.8.1) a
                # UnicodeDecodeError of the error message.
                except (tf.errors.OpError, UnicodeDecodeError) as e:
                    per_op[op] = None
                    results.setdefault("errors", {})[f"{op}_dim{dim}"] = str(e).split("\n")[0][:160]
                if op == "remove":
                    table.insert(keys[0], values[0])  # keep remove's cost comparable
        table.clear()
        results[f"dim{dim}"] = {op: (median(v) if v else None) for op, v in per_op.items()}
        results[f"busy_dim{dim}"] = {op: {side: median(v) if v else None for side, v in b.items()}
                                     for op, b in busy.items()}
    print_result(results)


def child_train(args) -> None:
    """Training examples/s: a Redis-backed variable and an in-memory one, same model."""
    import numpy as np
    import tensorflow as tf

    import tensorflow_dynemb as de

    rng = np.random.default_rng(1)
    batches = [tf.constant(rng.integers(0, 1_000_000, (args.train_batch,)), tf.int64)
               for _ in range(args.train_steps)]
    results = {}
    creators = {
        "redis": de.RedisTableCreator(de.RedisTableConfig(redis_config_abs_dir=args.config)),
        "memory": de.HashTableCreator(),
    }
    for label, creator in creators.items():
        var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=8, name=f"train_{label}",
                          initializer=tf.keras.initializers.RandomNormal(0.0, 0.1),
                          kv_creator=creator)
        dense = tf.Variable(tf.ones([8, 1]))
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                rows, view = de.embedding_lookup(var, ids, name="user", return_trainable=True)
                loss = tf.reduce_mean(tf.square(tf.matmul(rows, dense) - 1.0))
            grads = tape.gradient(loss, [view, dense])
            optimizer.apply_gradients(zip(grads, [view, dense]))
            return loss

        step(batches[0])  # trace, and create the slots
        start = time.perf_counter()
        for ids in batches[1:]:
            step(ids)
        results[label] = args.train_batch * (len(batches) - 1) / (time.perf_counter() - start)
    print_result(results)


def merged(runs, dims):
    """Per dim and op, the median over the rounds' results (None where a side failed),
    and the median CPU shares of the server and the client (`busy_dim<d>`)."""
    runs = [r for r in runs if r]
    if not runs:
        return None
    out = {}
    for d in dims:
        out[f"dim{d}"] = {op: median([r[f"dim{d}"][op] for r in runs if r[f"dim{d}"][op]])
                          for op in OPS}
        out[f"busy_dim{d}"] = {
            op: {side: median([r[f"busy_dim{d}"][op][side] for r in runs
                               if r[f"busy_dim{d}"][op][side] is not None] or [float("nan")])
                 for side in ("server", "client")}
            for op in OPS}
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    p.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    p.add_argument("--train-batch", type=int, default=4096)
    p.add_argument("--train-steps", type=int, default=21)
    p.add_argument("--tfra-python", default=os.environ.get("DYNEMB_TFRA_PYTHON"))
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--child", choices=["ops", "train"], help=argparse.SUPPRESS)
    p.add_argument("--tfra", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child == "ops":
        return child_ops(args)
    if args.child == "train":
        return child_train(args)
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from redis_util import RedisServer, write_config

    load_start = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(tmp)
        try:
            config = write_config(tmp, server.port, model_tag_runtime="bench",
                                  redis_socket_timeout=60000)
            common = ["--batch", str(args.batch), "--batches", str(args.batches),
                      "--repeats", str(args.repeats), "--dims", *map(str, args.dims),
                      "--train-batch", str(args.train_batch),
                      "--train-steps", str(args.train_steps), "--config", config,
                      "--server-pid", str(server.process.pid)]
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=os.path.join(HERE, "..") + os.pathsep + os.environ.get("PYTHONPATH", ""))
            me = os.path.abspath(__file__)
            # Rounds alternate ours and TFRA, so that a busy machine's drift hits both.
            ours_runs, tfra_runs, train_runs = [], [], []
            for _ in range(args.rounds):
                result, _ = spawn_child([sys.executable, me, "--child", "ops", *common], env)
                ours_runs.append(result)
                if args.tfra_python:
                    result, _ = spawn_child([args.tfra_python, me, "--child", "ops", "--tfra", *common],
                                            dict(env, PYTHONPATH=""))
                    tfra_runs.append(result)
                result, _ = spawn_child([sys.executable, me, "--child", "train", *common], env)
                train_runs.append(result)
            ours, tfra = merged(ours_runs, args.dims), merged(tfra_runs, args.dims)
            train = {k: median([r[k] for r in train_runs if r]) for k in ("redis", "memory")} \
                if any(train_runs) else None
        finally:
            server.kill()
    print(f"redis_ops: batch {args.batch}, {args.batches} batches x {args.repeats} repeats x "
          f"{args.rounds} rounds, load average {load_start} -> {loadavg()}")
    for dim in args.dims:
        for op in OPS:
            o = (ours or {}).get(f"dim{dim}", {}).get(op)
            t = (tfra or {}).get(f"dim{dim}", {}).get(op)
            ratio = f"{o / t:5.2f}x" if o and t else "  n/a"
            shares = "  ".join(
                f"{name} server {b['server']:.2f} client {b['client']:.2f}"
                for name, side in (("ours", ours), ("TFRA", tfra)) if side
                for b in [side[f"busy_dim{dim}"][op]])
            print(f"  dim {dim:3d} {op:7s} ours {o / 1e6 if o else 0:7.3f} Mkeys/s   "
                  f"TFRA {(t / 1e6) if t else float('nan'):7.3f} Mkeys/s   ours/TFRA {ratio}   "
                  f"CPU/s: {shares}")
    if train:
        print(f"  training (dim 8, batch {args.train_batch}, Adam): Redis-backed "
              f"{train['redis']:.0f} examples/s, in-memory {train['memory']:.0f} examples/s "
              f"({train['redis'] / train['memory']:.3f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ours": ours, "tfra": tfra, "train": train, "load_average": load_start,
                       "load_average_end": loadavg(), "rounds": {"ours": ours_runs, "tfra": tfra_runs,
                       "train": train_runs}, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
