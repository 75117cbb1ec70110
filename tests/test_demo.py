"""The demo (`python -m tensorflow_dynemb.demo`): its click-log generator (demo_data.py),
and one end-to-end run at a tiny size."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tensorflow_dynemb import demo, demo_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generator_is_deterministic_per_seed():
    specs = demo_data.feature_specs(len(demo_data.FEATURES), 100_000)
    features, labels, probabilities = demo_data.generate_clicks(5_000, specs, seed=3)
    again, labels_again, probabilities_again = demo_data.generate_clicks(5_000, specs, seed=3)
    other, _, _ = demo_data.generate_clicks(5_000, specs, seed=4)

    assert list(features) == [s.name for s in specs]
    for name, ids in features.items():
        assert ids.dtype == np.int64 and ids.shape == (5_000,)
        np.testing.assert_array_equal(ids, again[name])
        # Another seed, another world: other ids.
        assert not np.isin(other[name], ids).any(), name
    np.testing.assert_array_equal(labels, labels_again)
    np.testing.assert_array_equal(probabilities, probabilities_again)
    assert set(np.unique(labels)) == {0.0, 1.0}


def test_ids_are_hash_like_and_frequencies_follow_a_power_law():
    ranks = demo_data.sample_ranks(np.random.default_rng(0), 200_000, 1_000_000, zipf=1.1)
    assert 0 <= ranks.min() and ranks.max() < 1_000_000
    # Sorted counts against rank on log-log axes: a line of slope -zipf.
    counts = np.sort(np.bincount(ranks))[::-1]
    k = np.arange(3, 300)
    slope = np.polyfit(np.log(k + 1), np.log(counts[k]), 1)[0]
    assert -1.3 < slope < -0.9, slope
    # Heavy head, long tail: 1% of the distinct ids are most of the rows.
    distinct = np.count_nonzero(counts)
    assert counts[: distinct // 100].sum() > 0.5 * len(ranks)

    # Ranks map to distinct, large, non-negative int64 ids.
    ids = demo_data.ranks_to_ids(np.arange(100_000), seed=0, feature="user_id")
    assert len(np.unique(ids)) == 100_000
    assert ids.min() >= 0 and np.median(ids) > 2**60


def test_labels_are_learnable():
    """The true click probabilities separate clicks well (the ceiling of any model's
    AUC), and roc_auc agrees with a pairwise count."""
    specs = demo_data.feature_specs(len(demo_data.FEATURES), demo_data.DEFAULT_VOCAB)
    _, labels, probabilities = demo_data.generate_clicks(50_000, specs, seed=0)
    assert 0.1 < labels.mean() < 0.4
    assert 0.78 < demo_data.roc_auc(labels, probabilities) < 0.9

    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    scores = np.round(rng.random(300), 1)  # many ties
    pos, neg = scores[y][:, None], scores[~y][None, :]
    pairwise = ((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size)
    assert abs(demo_data.roc_auc(y, scores) - pairwise) < 1e-12


QUIET_START = os.path.join(ROOT, "tensorflow_dynemb", "_quiet_start.py")

# A stand-in for TensorFlow: writes C++-style lines to descriptor 2 on import and when
# its runtime starts, and fails on import when FAIL is set.
_FAKE_TENSORFLOW = """
import os, types
os.write(2, b"I0000 00:00:1.0 port.cc:153] start-up line\\n")
if os.environ.get("FAIL"):
    raise ImportError("no TensorFlow here")
config = types.SimpleNamespace(
    list_logical_devices=lambda: os.write(2, b"E0000 00:00:2.0 cuda_platform.cc:52] cuInit\\n"))
"""


@pytest.mark.parametrize("fail", [False, True])
def test_quiet_start_holds_back_only_a_start_that_works(tmp_path, fail):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(_FAKE_TENSORFLOW)
    program = "import os, sys; os.write(2, b'later\\n'); print(sys.argv[1:])"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), FAIL="1" if fail else "")
    result = subprocess.run([sys.executable, QUIET_START, "-c", program, "a", "b"],
                            capture_output=True, text=True, env=env, timeout=60)
    if fail:  # what the start wrote is shown, with the error
        assert result.returncode == 1 and result.stdout == ""
        assert "port.cc:153] start-up line" in result.stderr, result.stderr
        assert "ImportError: no TensorFlow here" in result.stderr, result.stderr
    else:  # held back; what the program writes later is not
        assert result.returncode == 0, result.stderr
        assert result.stdout == "['a', 'b']\n"
        assert result.stderr == "later\n"


def test_demo_workdir_is_removed_unless_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(demo.tempfile, "tempdir", str(tmp_path))
    with demo.demo_workdir(None, keep=False) as (workdir, kept):
        open(os.path.join(workdir, "f"), "w").close()
    assert not kept and not os.path.exists(workdir)
    with pytest.raises(RuntimeError):  # removed on failure too
        with demo.demo_workdir(None, keep=False) as (workdir, _):
            raise RuntimeError("demo failed")
    assert os.listdir(tmp_path) == []
    with demo.demo_workdir(None, keep=True) as (workdir, kept):
        pass
    assert kept and os.path.isdir(workdir) and workdir.startswith(str(tmp_path))
    own = str(tmp_path / "own")
    with demo.demo_workdir(own, keep=False) as (workdir, kept):
        pass
    assert (workdir, kept) == (own, True) and os.path.isdir(own)


def test_demo_end_to_end(tmp_path):
    """Generate, train, evaluate, checkpoint, restore and predict, export both
    SavedModels and serve them in fresh processes, at a tiny size; run as
    scripts/demo.sh runs it (through _quiet_start.py), its output redirected to a file
    as in CI: short, no overlong line, no C++ log line of TensorFlow's start."""
    cmd = [
        sys.executable, QUIET_START, "-m", "tensorflow_dynemb.demo",
        "--rows", "20000", "--vocab", "10000", "--epochs", "1",
        "--batch-size", "256", "--learning-rate", "0.005", "--min-auc", "0.6", "--keep",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(TMPDIR=str(tmp_path), PYTHONPATH=ROOT)
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        # From the repository root, so the package imports without an install too.
        result = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=env, timeout=300)
    output = log.read_text()
    assert result.returncode == 0, output
    assert re.search(r"^demo: PASSED \(held-out AUC 0\.\d+ >= 0\.6, restored predictions match, "
                     r"both SavedModels serve the trained model's prediction\)$",
                     output, re.MULTILINE), output
    assert re.search(r"^held-out AUC\s+0\.\d+", output, re.MULTILINE), output

    lines = output.splitlines()
    assert len(output) < 6000 and max(len(line) for line in lines) < 2000, output
    assert "\r" not in output, output  # no progress bar
    # Keras' per-epoch lines instead, one per epoch.
    assert len([line for line in lines if re.match(r"^\d+/\d+ - ", line)]) == 1, output
    # No C++ log line ("I0000 00:00:...", "E0000 ..."): start-up lines are held back.
    assert not [line for line in lines if re.match(r"^[IWEF]\d{4} ", line)], output

    # Kept, in the temporary directory, and the summary says where.
    (workdir,) = [p for p in tmp_path.iterdir() if p.name.startswith("dynemb_demo_")]
    assert re.search(rf"^outputs +{re.escape(str(workdir))} .*kept$", output, re.MULTILINE), output
    assert (workdir / "ckpt" / "ctr_model.index").exists(), output
    # One prediction served from each SavedModel, equal to the trained model's.
    live = re.search(r"^saved models .*: trained model predicts (0\.\d+)$", output, re.MULTILINE)
    assert live, output
    for title, directory in (("with our ops", "saved_model"),
                             ("static (stock TF)", "saved_model_static")):
        served = re.search(
            rf"^  {re.escape(title)} +{directory} \(.*\); served in a fresh process: (0\.\d+) ",
            output, re.MULTILINE)
        assert served, output
        assert abs(float(served.group(1)) - float(live.group(1))) <= 1e-5, output
        assert (workdir / directory / "saved_model.pb").exists(), output


@pytest.mark.slow
def test_demo_on_movielens(tmp_path):
    """`--data movielens`: trains on MovieLens-100k (fetched and cached), reports the
    held-out AUC beside a static-vocabulary Keras model and the majority class, and
    serves a held-out row from both SavedModels in fresh processes."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        pytest.skip("pyarrow is missing (pip install 'tensorflow-dynemb[movielens]')")
    cmd = [sys.executable, QUIET_START, "-m", "tensorflow_dynemb.demo", "--data", "movielens"]
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=ROOT)
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    scores = {
        title: (float(auc), float(accuracy))
        for title, auc, accuracy in re.findall(
            r"^  (dynamic embeddings \(ours\)|static vocabulary \(IntegerLookup\)|majority class "
            r"\(always liked\)) +(0\.\d+) +(\d+\.\d)%", output, re.MULTILINE)
    }
    assert len(scores) == 3, output
    ours, static = scores["dynamic embeddings (ours)"], scores["static vocabulary (IntegerLookup)"]
    majority = scores["majority class (always liked)"]
    # Learned: well above the majority class, and level with Keras' static tables.
    assert ours[0] >= 0.72 and ours[1] > majority[1] + 8, output
    assert abs(ours[0] - static[0]) < 0.02, output
    assert re.search(r"^demo: PASSED", output, re.MULTILINE), output
    assert os.listdir(tmp_path) == [], "the demo's outputs were not removed"
