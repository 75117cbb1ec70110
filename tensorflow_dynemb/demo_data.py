"""The demo's synthetic click log and the metric it is scored by (numpy only).

A click log of categorical features (user_id, item_id, advertiser_id, category, city,
device, hour, ...) with up to `--vocab` possible ids each, drawn with power-law
(Zipf-like) frequencies as in real logs, as large hash-like int64 values rather than
dense indices. The click label is Bernoulli(sigmoid(bias + sum of per-id effects + a
device x hour interaction)); the effects are pure functions of the ids, so no table of
millions of effects is ever built. `roc_auc` scores predictions (exact, ties counting
one half). Used by demo.py (`python -m tensorflow_dynemb.demo`, whose docstring tells
the whole story) and by demo_movielens.py.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

import numpy as np

# Vocabulary sizes below are those of the default --vocab; features with
# `scales=True` grow or shrink proportionally with --vocab.
DEFAULT_VOCAB = 1_000_000


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One categorical feature of the click log.

    Attributes:
      name: feature (and model input) name.
      vocab: number of possible ids.
      zipf: power-law exponent s of the id frequencies (P(rank k) ~ k^-s).
      effect_std: standard deviation of the per-id effects on the click logit.
      scales: whether `vocab` scales with --vocab.
    """

    name: str
    vocab: int
    zipf: float
    effect_std: float
    scales: bool = True


# Large, skewed id spaces carry most of the signal (that is what dynamic
# embeddings are for); small ones (device, hour) are fully learnable.
FEATURES: Tuple[FeatureSpec, ...] = (
    FeatureSpec("user_id", 1_000_000, zipf=1.0, effect_std=0.8),
    FeatureSpec("item_id", 250_000, zipf=1.1, effect_std=0.8),
    FeatureSpec("advertiser_id", 10_000, zipf=1.1, effect_std=0.6),
    FeatureSpec("category", 1_000, zipf=1.0, effect_std=0.6, scales=False),
    FeatureSpec("city", 3_000, zipf=1.2, effect_std=0.4, scales=False),
    FeatureSpec("device", 30, zipf=1.5, effect_std=0.4, scales=False),
    FeatureSpec("hour", 24, zipf=0.3, effect_std=0.2, scales=False),
)
# Features past len(FEATURES) (with --features N) are generic ones like this.
EXTRA_FEATURE = FeatureSpec("feature_{}", 100_000, zipf=1.1, effect_std=0.3)
# A pairwise interaction (an effect per (device, hour) pair): the MLP can learn
# it, a sum of per-feature terms cannot.
INTERACTION = ("device", "hour")
INTERACTION_STD = 0.5
# Intercept of the click logit: about 20% of the rows are clicks.
BIAS = -1.8

_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)


def feature_specs(num_features: int, vocab: int) -> List[FeatureSpec]:
    """The first `num_features` features, their vocabularies scaled to `vocab`."""
    specs = []
    for i in range(num_features):
        spec = FEATURES[i] if i < len(FEATURES) else dataclasses.replace(
            EXTRA_FEATURE, name=EXTRA_FEATURE.name.format(i))
        if spec.scales:
            spec = dataclasses.replace(spec, vocab=max(2, round(spec.vocab * vocab / DEFAULT_VOCAB)))
        specs.append(spec)
    return specs


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that scatters bits like a hash."""
    with np.errstate(over="ignore"):
        z = x.astype(_U64) + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def _salt(seed: int, *parts: str) -> np.uint64:
    """A uint64 constant derived from the seed and names (stable across processes,
    unlike Python's salted `hash`)."""
    h = mix64(np.array([seed], dtype=_U64))
    for part in parts:
        for byte in part.encode():
            h = mix64(h ^ _U64(byte))
    return h[0]


def sample_ranks(rng: np.random.Generator, n: int, vocab: int, zipf: float) -> np.ndarray:
    """`n` ranks in [0, vocab) with P(rank k) roughly proportional to (k + 1)^-zipf.

    Inverse-CDF sampling of the continuous power law on [1, vocab + 1): exact in
    the tail, vectorised, and needs no table of `vocab` probabilities.
    """
    u = rng.random(n)
    if abs(zipf - 1.0) < 1e-9:
        x = np.power(vocab + 1.0, u)
    else:
        a = 1.0 - zipf
        x = np.power(1.0 + u * ((vocab + 1.0) ** a - 1.0), 1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, vocab - 1)


def ranks_to_ids(ranks: np.ndarray, seed: int, feature: str) -> np.ndarray:
    """Hash-like non-negative int64 ids for ranks: distinct ranks get distinct ids,
    scattered over 63 bits, as the fingerprints real pipelines produce."""
    return (mix64(ranks.astype(_U64) ^ _salt(seed, "id", feature)) >> _U64(1)).astype(np.int64)


def hashed_normal(keys: np.ndarray, salt: np.uint64) -> np.ndarray:
    """A standard normal value per key, a pure function of (key, salt).

    Effects are computed from the ids on the fly, so no table of millions of
    effects is ever built. Box-Muller on the two 32-bit halves of a hash.
    """
    h = mix64(keys.astype(_U64) ^ salt)
    u1 = ((h >> _U64(32)).astype(np.float64) + 0.5) / 2.0**32
    u2 = ((h & _MASK32).astype(np.float64) + 0.5) / 2.0**32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def generate_clicks(
    rows: int, specs: Sequence[FeatureSpec], seed: int
) -> Tuple[Dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A synthetic click log.

    Returns:
      (features, labels, probabilities): `features[name]` is an int64 `[rows]`
      array of ids, `labels` a float32 `[rows]` array of 0/1 clicks and
      `probabilities` the true click probability of each row. Rows are i.i.d.,
      so the log needs no shuffling. Same arguments, same log.
    """
    rng = np.random.default_rng(seed)
    features = {}
    logit = np.full(rows, BIAS)
    for spec in specs:
        ids = ranks_to_ids(sample_ranks(rng, rows, spec.vocab, spec.zipf), seed, spec.name)
        features[spec.name] = ids
        logit += spec.effect_std * hashed_normal(ids, _salt(seed, "effect", spec.name))
    a, b = INTERACTION
    if a in features and b in features:
        pair = mix64(features[a]) ^ features[b].astype(_U64)
        logit += INTERACTION_STD * hashed_normal(pair, _salt(seed, "interaction"))
    probabilities = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(rows) < probabilities).astype(np.float32)
    return features, labels, probabilities


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U; tied scores count one half)."""
    labels = np.asarray(labels).ravel() > 0.5
    scores = np.asarray(scores, dtype=np.float64).ravel()
    order = np.argsort(scores, kind="stable")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based mean rank of each tie group
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
