"""Synchronous multi-worker training: MultiWorkerMirroredStrategy on a real local cluster.

Every worker is its own process (`multi_worker_worker.py`, started by `cluster_util`)
with `TF_CONFIG` naming the workers' loopback ports; collectives go over gRPC, on CPUs.
Each run is compared with one process training the same model on the concatenation of
the workers' batches (the same module, in reference mode):

- custom `strategy.run` loops with Keras 3 SGD, Adam and Adagrad for 20 steps (batches
  of varying size, an empty one, ids repeated within and across workers): the union of
  the workers' slices equals the reference's table and slots, each id held by exactly
  its owner; a replicated table (`devices` given) stays equal on every worker;
- a bounded, admitting, bp_v2 variable with a restrict policy: content, statistics and
  a global restriction;
- Keras 3's own `fit` under this strategy fails for a dense model too (then ours is
  allowed the same error);
- tf_keras `fit` / `evaluate` / `predict` with the three layers, and a tf_keras custom
  loop;
- checkpoints: 2 workers -> 3 workers (which then train on) -> 1 process; Keras weight
  checkpoints and `.keras` files into 3 workers and 1 process; a SavedModel served in
  one process;
- a killed worker (the survivor fails within seconds; a restarted cluster restores the
  last checkpoint whole) and a stalled one (the collective timeout ends the step).
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

import cluster_util as cu
import multi_worker_worker as mw
from _tables_util import temp_workdir

TIMEOUT = 300  # seconds for one process
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_worker_worker.py")
LOOP_KINDS = ["sgd", "adam", "adagrad"]


def _start(mode, args, log, env=None):
    return cu.start(mode, args, log, script=SCRIPT, env=env)


def run_cluster(mode, num_workers, args, workdir, tag, env=None, reference=None):
    """Runs `mode` on `num_workers` worker processes (and, concurrently, the reference
    process `reference = (mode, args)` if given); returns the workers' results in rank
    order (and the reference's)."""
    workers = [f"127.0.0.1:{port}" for port in cu.free_ports(num_workers)]
    logs = [os.path.join(workdir, f"{tag}-worker{i}.log") for i in range(num_workers)]
    procs = [
        _start(mode, dict(args, workers=workers, index=i), log, env)
        for i, log in enumerate(logs)
    ]
    ref_log = os.path.join(workdir, f"{tag}-reference.log")
    ref = _start(reference[0], reference[1], ref_log, env) if reference else None
    results = [cu.result_of(p, log, TIMEOUT) for p, log in zip(procs, logs)]
    if ref is None:
        return results
    return results, cu.result_of(ref, ref_log, TIMEOUT)


def merged(parts):
    """The union of the workers' `{key: row}` slices; fails if a key is in two."""
    out = {}
    for part in parts:
        for key, row in part.items():
            assert key not in out, f"key {key} held by two workers"
            out[key] = row
    return out


def assert_same_rows(got, expected, tol=1e-5):
    assert set(got) == set(expected), (sorted(set(got) ^ set(expected)))
    for key, row in expected.items():
        np.testing.assert_allclose(got[key], row, rtol=tol, atol=tol, err_msg=f"key {key}")


def assert_slices_owned(slices):
    """Each worker's keys are exactly those `default_partition_fn` assigns to its rank."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    for rank, part in enumerate(slices):
        keys = np.array([int(k) for k in part], np.int64)
        if keys.size:
            owners = de.default_partition_fn(tf.constant(keys), len(slices)).numpy()
            assert (owners == rank).all(), (rank, keys[owners != rank])


SLOTS = {"sgd": [], "adam": ["m", "v"], "adagrad": ["accumulator"], "tf_keras_adam": ["m", "v"]}


def assert_loop_matches(workers, reference, kind):
    """The workers' slices of a custom loop together equal the reference, row by row and
    slot by slot; dense variables, losses, the step counter and a lookup inside
    strategy.run agree too."""
    for field in ["rows"] + SLOTS[kind]:
        slices = [w[kind][field] for w in workers]
        assert_slices_owned(slices)
        assert_same_rows(merged(slices), reference[kind][field])
    for w in workers:
        for got, expected in zip(w[kind]["dense"], reference[kind]["dense"]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert w[kind]["iterations"] == reference[kind]["iterations"]
        np.testing.assert_allclose(w[kind]["lookup"], reference[kind]["lookup"], rtol=1e-5, atol=1e-6)
        assert w[kind]["lookup_exists"] == reference[kind]["lookup_exists"]
    # Each worker's loss is its share of the global batch's: they add up.
    summed = np.sum([w[kind]["losses"] for w in workers], axis=0)
    np.testing.assert_allclose(summed, reference[kind]["losses"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------
# Custom loops (Keras 3), policies, Keras 3 fit, checkpoints across worker counts
# ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def two_workers():
    """2 workers: the custom loops (and a replicated table), saved to a checkpoint per
    optimizer; the policies; Keras 3's fit. And the reference."""
    workdir = temp_workdir()
    kinds = LOOP_KINDS + ["adam_replicated"]
    args = {"optimizers": kinds, "policies": True, "checkpoint_to": f"{workdir}/two"}
    started = time.time()
    workers, reference = run_cluster(
        "loop",
        2,
        dict(args, keras3_fit=True),
        workdir,
        "two",
        reference=("reference_loop", dict(args, num_workers=2, checkpoint_to=None)),
    )
    return {"workers": workers, "reference": reference, "dir": workdir, "seconds": time.time() - started}


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_custom_loop_equals_one_process_on_the_global_batch(kind):
    run = two_workers()
    assert_loop_matches(run["workers"], run["reference"], kind)
    assert len(run["reference"][kind]["rows"]) == mw.NUM_IDS  # every id was trained


def test_batches_cover_the_edge_cases():
    """The data has what the equality above must survive: an empty per-worker batch,
    varying sizes, ids repeated within a batch and across workers, and workers that
    see no id of some shard in a step."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    sizes = {len(mw.batch(s, w, 2)[0]) for s in range(mw.STEPS) for w in range(2)}
    assert 0 in sizes and len(sizes) > 3
    missing_shard = repeated = 0
    for step in range(mw.STEPS):
        ids = [mw.batch(step, w, 3)[0].reshape(-1) for w in range(3)]
        repeated += any(len(set(i)) < len(i) for i in ids)
        for worker_ids in ids:
            shards = de.default_partition_fn(tf.constant(worker_ids, tf.int64), 3).numpy()
            missing_shard += len(set(shards.tolist())) < 3
        assert set(ids[0]) & set(ids[2])
    assert repeated and missing_shard


def test_replicated_table_copies_stay_equal():
    """A table given `devices` is a full copy on every worker; every worker applies
    every worker's gradients, so each copy equals the one-process table."""
    run = two_workers()
    for w in run["workers"]:
        for field in ("rows", "m", "v"):
            assert_same_rows(w["adam_replicated"][field], run["reference"]["adam_replicated"][field])


def test_policies_bounded_admission_bp_v2_restrict_and_statistics():
    """A bounded (LFU) model-parallel variable with admission (min_count 2), bp_v2 and a
    frequency restrict policy equals one process whose variable has one shard per
    worker of the same capacity; the statistics summed over the workers equal its
    statistics; restrict keeps POLICY_RESERVED keys of the whole variable."""
    run = two_workers()
    workers = [w["policies"] for w in run["workers"]]
    reference = run["reference"]["policies"]
    for phase in ("trained", "restricted"):
        for field in ("rows", "m", "v", "status"):
            slices = [w[phase][field] for w in workers]
            assert_slices_owned(slices)
            assert_same_rows(merged(slices), reference[phase][field])
    assert len(reference["trained"]["rows"]) == 2 * mw.POLICY_CAPACITY  # the shards evicted
    assert reference["stats"]["evictions"] > 0
    assert len(merged([w["restricted"]["rows"] for w in workers])) == mw.POLICY_RESERVED
    for w in workers:
        assert w["stats"] == reference["stats"]
        assert w["restricted_stats"] == reference["restricted_stats"]


def test_keras3_fit_fails_only_where_it_fails_for_a_dense_model():
    """Keras 3's own `fit` under MultiWorkerMirroredStrategy: where it cannot train a
    dense-only model (Keras 3.15: "Attempt to convert a value (PerReplica ..."), a model
    of de.keras.layers fails with the same error; where it can, ours must too."""
    outcomes = two_workers()["workers"][0]["keras3_fit"]
    if outcomes["dense"]["ok"]:
        assert outcomes["embedding"] == {"ok": True, "error": ""}
    else:
        assert outcomes["embedding"]["error"] == outcomes["dense"]["error"]


@functools.lru_cache(maxsize=None)
def three_workers():
    """The 2-worker checkpoints restored into 3 workers, which train 20 more steps on
    their batches and save; the reference restores the same checkpoints into one
    process and trains on the 3 workers' global batches; one more process restores the
    3 workers' checkpoints."""
    run = two_workers()
    workdir = run["dir"]
    args = {"optimizers": LOOP_KINDS, "restore_from": f"{workdir}/two"}
    workers, reference = run_cluster(
        "loop",
        3,
        dict(args, checkpoint_to=f"{workdir}/three"),
        workdir,
        "three",
        reference=("reference_loop", dict(args, num_workers=3)),
    )
    log = os.path.join(workdir, "one.log")
    one = _start(
        "reference_loop",
        {"optimizers": LOOP_KINDS, "num_workers": 3, "steps": 0, "restore_from": f"{workdir}/three"},
        log,
    )
    return {"workers": workers, "reference": reference, "one": cu.result_of(one, log, TIMEOUT)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_checkpoint_two_workers_to_three_to_one_process(kind):
    """2 -> 3: the 3 workers' slices together hold exactly the 2 workers' content
    (rows and slots, each key on its new owner), and the step counter. 3 workers then
    train as one process restored from the same checkpoint. 3 -> 1: one process
    restores exactly the 3 workers' content."""
    two, three = two_workers(), three_workers()
    for field in ["rows"] + SLOTS[kind]:
        restored = [w[kind]["restored"][field] for w in three["workers"]]
        assert_slices_owned(restored)
        saved = merged([w[kind][field] for w in two["workers"]])
        assert merged(restored) == saved  # identical: no arithmetic in between
        final = merged([w[kind][field] for w in three["workers"]])
        assert three["one"][kind]["restored"][field] == final
    assert three["workers"][0][kind]["restored"]["iterations"] == mw.STEPS
    assert_loop_matches(three["workers"], three["reference"], kind)


# ----------------------------------------------------------------------------------------
# tf_keras: fit / evaluate / predict, custom loop, weight files, SavedModel
# ----------------------------------------------------------------------------------------

LAYERS = ["Embedding", "SquashedEmbedding", "FieldWiseEmbedding"]
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}


@functools.lru_cache(maxsize=None)
def tf_keras_two_workers():
    workdir = temp_workdir()
    args = {"layers": LAYERS + ["DecoratedCall"], "legacy_keras": True, "optimizers": ["tf_keras_adam"]}
    workers, reference = run_cluster(
        "keras",
        2,
        dict(args, save_to=f"{workdir}/keras"),
        workdir,
        "keras",
        env=LEGACY,
        reference=("keras", dict(args, reference=True, num_workers=2)),
    )
    return {"workers": workers, "reference": reference, "dir": workdir}


@pytest.mark.parametrize("layer", LAYERS + ["DecoratedCall"])
def test_tf_keras_fit_evaluate_predict_equal_one_process(layer):
    run = tf_keras_two_workers()
    reference = run["reference"][layer]
    slices = [w[layer]["rows"] for w in run["workers"]]
    assert all(w[layer]["model_parallel"] for w in run["workers"])
    assert_slices_owned(slices)
    assert_same_rows(merged(slices), reference["rows"])
    for slot in ("m", "v"):
        assert_same_rows(merged([w[layer]["slots"][slot] for w in run["workers"]]), reference["slots"][slot])
    for w in run["workers"]:
        np.testing.assert_allclose(w[layer]["losses"], reference["losses"], rtol=1e-5)
        np.testing.assert_allclose(w[layer]["evaluate"], reference["evaluate"], rtol=1e-5)
        np.testing.assert_allclose(w[layer]["predict"], reference["predict"], rtol=1e-5, atol=1e-6)
        for got, expected in zip(w[layer]["dense"], reference["dense"]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_tf_keras_optimizer_custom_loop():
    run = tf_keras_two_workers()
    assert_loop_matches(run["workers"], run["reference"], "tf_keras_adam")


@functools.lru_cache(maxsize=None)
def tf_keras_loaded():
    """What the 2 workers saved (weights checkpoint, .keras, SavedModel), loaded into 3
    workers and, concurrently, into one process (which also serves the SavedModel)."""
    run = tf_keras_two_workers()
    args = {"layers": LAYERS, "legacy_keras": True, "load_from": f"{run['dir']}/keras"}
    workers, one = run_cluster(
        "keras",
        3,
        args,
        run["dir"],
        "keras-load",
        env=LEGACY,
        reference=("keras", dict(args, reference=True, num_workers=2)),
    )
    return {"workers": workers, "one": one}


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
def test_keras_weights_and_files_restore_into_three_workers_and_one_process(layer):
    run, loaded = tf_keras_two_workers(), tf_keras_loaded()
    saved = merged([w[layer]["rows"] for w in run["workers"]])
    for source in ("weights", "keras_file"):
        slices = [w[layer][source]["rows"] for w in loaded["workers"]]
        assert_slices_owned(slices)
        assert merged(slices) == saved, source
        assert loaded["one"][layer][source]["rows"] == saved, source
    for slot in ("m", "v"):  # the weights checkpoint holds the optimizer's slots
        saved_slot = merged([w[layer]["slots"][slot] for w in run["workers"]])
        assert merged([w[layer]["weights"]["slots"][slot] for w in loaded["workers"]]) == saved_slot
        assert loaded["one"][layer]["weights"]["slots"][slot] == saved_slot


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
def test_saved_model_after_multi_worker_training_serves_in_one_process(layer):
    run, loaded = tf_keras_two_workers(), tf_keras_loaded()
    np.testing.assert_allclose(
        loaded["one"][layer]["served"], run["workers"][0][layer]["predict"], rtol=1e-5, atol=1e-6
    )


# ----------------------------------------------------------------------------------------
# A worker fails
# ----------------------------------------------------------------------------------------

FAIL_AT, SAVE_AFTER = 6, 4


def _failover(how, env=None, tries=3):
    """Runs the failover scenario `how`; returns the survivor's result and the workdir.

    TF 2.16's collective abort path can itself crash the survivor (SIGSEGV after
    "Collective has timed out", seen in CI under load: in TF's error decoration,
    `get_graph_debug_info`, which the worker now skips on TF 2.16; no kernel of ours runs
    asynchronously). A crash by a signal is run again; a wrong result never is.
    """
    for attempt in range(tries):
        workdir = temp_workdir()
        args = {
            "victim": 1,
            "fail_at": FAIL_AT,
            "how": how,
            "stall_seconds": 120,
            "save_after": SAVE_AFTER,
            "checkpoint_dir": f"{workdir}/ckpt",
        }
        workers = [f"127.0.0.1:{port}" for port in cu.free_ports(2)]
        logs = [os.path.join(workdir, f"{how}-worker{i}.log") for i in range(2)]
        procs = [
            _start("failover", dict(args, workers=workers, index=i), log, env)
            for i, log in enumerate(logs)
        ]
        try:
            survivor = cu.result_of(procs[0], logs[0], TIMEOUT)
        except AssertionError:
            crashed = procs[0].returncode is not None and procs[0].returncode < 0
            if crashed and attempt + 1 < tries:
                continue
            raise
        finally:
            cu._kill(procs[1])
        return survivor, workdir


def _saved(workdir):
    """What each worker of `_failover` had saved, in rank order."""
    import json

    with open(os.path.join(workdir, "ckpt", "saved-0.json")) as f0, open(
        os.path.join(workdir, "ckpt", "saved-1.json")
    ) as f1:
        return [json.load(f0), json.load(f1)]


@pytest.mark.slow
def test_killed_worker_fails_the_others_quickly_and_the_last_checkpoint_restores():
    """Worker 1 dies before its step 6: worker 0's step fails with an error naming the lost
    worker within seconds (gRPC notices the closed connection; TF's coordination
    service would after its heartbeat timeout), not a hang. A restarted cluster
    restores the checkpoint of step 4 with nothing lost."""
    survivor, workdir = _failover("kill")
    failure = survivor["failure"]
    # The victim dies before its step 6; the survivor may still be finishing step 5's
    # exchanges with it.
    assert failure["step"] in (FAIL_AT - 1, FAIL_AT)
    assert failure["type"] in ("UnavailableError", "AbortedError", "InternalError")
    assert "task:1" in failure["message"]
    assert failure["seconds"] < 60
    restarted = run_cluster(
        "loop",
        2,
        {"optimizers": ["adam"], "steps": 0, "restore_from": f"{workdir}/ckpt"},
        workdir,
        "restart",
    )
    saved = _saved(workdir)
    for field in ("rows", "m", "v"):
        slices = [w["adam"]["restored"][field] for w in restarted]
        assert_slices_owned(slices)
        assert merged(slices) == merged([s[field] for s in saved])
    assert restarted[0]["adam"]["restored"]["iterations"] == SAVE_AFTER
    for got, expected in zip(restarted[0]["adam"]["restored"]["dense"], saved[0]["dense"]):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_stalled_worker_ends_the_step_at_the_collective_timeout():
    """Worker 1 stays alive (its heartbeats go on) but stops taking part in the step:
    worker 0's exchange fails with a DeadlineExceededError after the collective timeout
    (DYNEMB_COLLECTIVE_TIMEOUT_SECONDS, here 5 s) instead of waiting for ever."""
    from tensorflow_dynemb.distribute import TIMEOUT_ENV

    survivor, _ = _failover("stall", env={TIMEOUT_ENV: "5"})
    failure = survivor["failure"]
    assert failure["step"] == FAIL_AT
    assert failure["type"] == "DeadlineExceededError"
    assert "timed out" in failure["message"]
    assert 5 <= failure["seconds"] < 40


# ----------------------------------------------------------------------------------------
# In-process: what needs no cluster
# ----------------------------------------------------------------------------------------


def test_variables_are_model_parallel_only_under_a_multi_worker_strategy():
    import tensorflow as tf
    import tensorflow_dynemb as de

    assert de.Variable(dim=2).worker_group is None
    with tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"]).scope():
        assert de.Variable(dim=2).worker_group is None


class _FakeStrategy:
    """Just what `collective_timeout` reads of a MultiWorkerMirroredStrategy."""

    def __init__(self, timeout):
        from types import SimpleNamespace

        launcher = SimpleNamespace(
            _group_key=1,
            _group_size=2,
            _next_instance_key=None,
            _get_ordering_token=None,
            _options=SimpleNamespace(timeout_seconds=timeout),
        )
        self.extended = SimpleNamespace(_cross_device_ops=SimpleNamespace(_launchers=[launcher]))


@pytest.mark.parametrize(
    "env, strategy_timeout, expected",
    [("5", None, 5.0), ("0.5", 30, 0.5), (None, 30, 30.0), (None, None, 600.0)],
)
def test_collective_timeout_from_environment_then_strategy_then_default(
    monkeypatch, env, strategy_timeout, expected
):
    from tensorflow_dynemb.distribute import TIMEOUT_ENV, WorkerGroup, collective_timeout

    if env is None:
        monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(TIMEOUT_ENV, env)
    group = WorkerGroup(2, 0, "/device:CPU:0", _FakeStrategy(strategy_timeout))
    assert collective_timeout(group) == expected


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_collective_timeout_rejects_a_bad_setting(monkeypatch, value):
    from tensorflow_dynemb.distribute import TIMEOUT_ENV, WorkerGroup, collective_timeout

    monkeypatch.setenv(TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"{TIMEOUT_ENV} must be a positive number.*{value!r}"):
        collective_timeout(WorkerGroup(2, 0, "/device:CPU:0", _FakeStrategy(None)))


def test_padded_bytes_counts_every_remote_chunk_at_the_largest_count():
    from tensorflow_dynemb.distribute.collectives import padded_bytes

    assert padded_bytes([[1, 3], [2, 0]], 10) == 30  # one remote chunk of 3 entries
    assert padded_bytes([[0, 0, 0]] * 3, 10) == 20  # empty: chunks of one padding entry
