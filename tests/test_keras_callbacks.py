"""de.keras.callbacks: periodic restriction and table statistics under model.fit."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de


def fitted_model(callbacks, steps: int = 6, **layer_kwargs):
    """A model over one Embedding layer, fit for `steps` batches; step s uses ids
    0..s (so id i is trained steps - i times) and a one-off id 100 + s."""
    ids = tf.keras.Input(shape=(None,), dtype="int64")
    layer = de.keras.layers.Embedding(2, name="emb", initializer=0.5, **layer_kwargs)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(layer(ids))
    out = tf.keras.layers.Dense(1)(pooled)
    model = tf.keras.Model(ids, out)
    model.compile(optimizer="adam", loss="mse")
    batches = [np.array([list(range(s + 1)) + [100 + s]] * 2, np.int64) for s in range(steps)]
    for x in batches:  # one step per batch; ragged widths, so one fit call each
        model.fit(x, np.ones([2, 1]), epochs=1, verbose=0, callbacks=callbacks)
    return model, layer


def test_variables_of_finds_the_layer_tables_not_the_slots():
    model, layer = fitted_model([])
    assert de.keras.callbacks.variables_of(model) == [layer.params]


def test_restrict_callback_restricts_every_n_steps():
    # The callback counts steps over fit calls: it restricts once, after the sixth,
    # when ids 0, 1, 2 have been trained 6, 5 and 4 times and the rest at most 3.
    callback = de.keras.callbacks.RestrictCallback(3, every_n_steps=6, trigger=4)
    model, layer = fitted_model([callback], restrict_policy=de.FrequencyRestrictPolicy)
    keys, _ = layer.params.export()
    assert sorted(keys.numpy().tolist()) == [0, 1, 2]
    for slot in layer.params.slot_variables:
        assert sorted(slot.export()[0].numpy().tolist()) == [0, 1, 2]


def test_restrict_callback_by_variable_name_leaves_others_alone():
    callback = de.keras.callbacks.RestrictCallback({"other": 1}, every_n_steps=1)
    _, layer = fitted_model([callback], restrict_policy=de.FrequencyRestrictPolicy)
    assert int(layer.params.size()) == 12  # ids 0..5 and 100..105


def test_table_stats_callback_writes_scalars(tmp_path):
    callback = de.keras.callbacks.TableStatsCallback(str(tmp_path), every_n_steps=1)
    _, layer = fitted_model([callback], steps=2)
    files = glob.glob(str(tmp_path / "train" / "events.out.tfevents.*"))
    assert files
    latest = {}  # tag -> (step, value); each fit call writes its own events file
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                point = (event.step, float(tf.make_ndarray(value.tensor)))
                latest[value.tag] = max(latest.get(value.tag, point), point)
    tags = {tag: value for tag, (_, value) in latest.items()}
    name = layer.params.name
    assert {f"dynamic_embedding/{name}/{k}" for k in ("size", "inserts", "lookups", "load_factor")} <= set(tags)
    assert tags[f"dynamic_embedding/{name}/size"] == 4  # ids 0, 100 then 0, 1, 101


def test_callback_arguments_are_checked():
    with pytest.raises(ValueError, match="every_n_steps"):
        de.keras.callbacks.RestrictCallback(10, every_n_steps=0)
