"""The demo (`python -m tensorflow_dynemb.demo`): its click-log generator, and one
end-to-end run at a tiny size."""

import os
import re
import subprocess
import sys

import numpy as np

from tensorflow_dynemb import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generator_is_deterministic_per_seed():
    specs = demo.feature_specs(len(demo.FEATURES), 100_000)
    features, labels, probabilities = demo.generate_clicks(5_000, specs, seed=3)
    again, labels_again, probabilities_again = demo.generate_clicks(5_000, specs, seed=3)
    other, _, _ = demo.generate_clicks(5_000, specs, seed=4)

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
    ranks = demo.sample_ranks(np.random.default_rng(0), 200_000, 1_000_000, zipf=1.1)
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
    ids = demo.ranks_to_ids(np.arange(100_000), seed=0, feature="user_id")
    assert len(np.unique(ids)) == 100_000
    assert ids.min() >= 0 and np.median(ids) > 2**60


def test_labels_are_learnable():
    """The true click probabilities separate clicks well (the ceiling of any model's
    AUC), and roc_auc agrees with a pairwise count."""
    specs = demo.feature_specs(len(demo.FEATURES), demo.DEFAULT_VOCAB)
    _, labels, probabilities = demo.generate_clicks(50_000, specs, seed=0)
    assert 0.1 < labels.mean() < 0.4
    assert 0.78 < demo.roc_auc(labels, probabilities) < 0.9

    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    scores = np.round(rng.random(300), 1)  # many ties
    pos, neg = scores[y][:, None], scores[~y][None, :]
    pairwise = ((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size)
    assert abs(demo.roc_auc(y, scores) - pairwise) < 1e-12


def test_demo_end_to_end(tmp_path):
    """Generate, train, evaluate, checkpoint, restore and predict, export both
    SavedModels and serve them in fresh processes, at a tiny size."""
    cmd = [
        sys.executable, "-m", "tensorflow_dynemb.demo",
        "--rows", "20000", "--vocab", "10000", "--epochs", "1",
        "--batch-size", "256", "--learning-rate", "0.005",
        "--min-auc", "0.6", "--verbose", "2", "--workdir", str(tmp_path),
    ]
    # From the repository root, so the package imports without an install too.
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(r"^demo: PASSED \(held-out AUC 0\.\d+ >= 0\.6, restored predictions match, "
                     r"both SavedModels serve the trained model's prediction\)$",
                     result.stdout, re.MULTILINE), output
    assert re.search(r"^held-out AUC\s+0\.\d+", result.stdout, re.MULTILINE), output
    assert os.path.exists(os.path.join(tmp_path, "ckpt", "ctr_model.index")), output
    # One prediction served from each SavedModel, equal to the trained model's.
    live = re.search(r"^saved models .*: trained model predicts (0\.\d+)$", result.stdout,
                     re.MULTILINE)
    assert live, output
    for title, directory in (("with our ops", "saved_model"),
                             ("static (stock TF)", "saved_model_static")):
        served = re.search(
            rf"^  {re.escape(title)} +\S+ \(.*\); served in a fresh process: (0\.\d+) ",
            result.stdout, re.MULTILINE)
        assert served, output
        assert abs(float(served.group(1)) - float(live.group(1))) <= 1e-5, output
        assert os.path.exists(os.path.join(tmp_path, directory, "saved_model.pb")), output
