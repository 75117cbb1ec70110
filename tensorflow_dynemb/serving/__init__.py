"""Serving: `export_static_saved_model` (static_export.py) freezes every table a
signature reads into stock TF objects (frozen.py, keyed_random.py); online learning's
`DeltaExporter` (delta_exporter.py) writes a base and deltas of what changed, and
`DeltaUpdater` (delta_updater.py) applies them to a served model
(delta_items.py: what both sides find in a model)."""

from tensorflow_dynemb.serving.delta_exporter import DeltaExporter
from tensorflow_dynemb.serving.delta_updater import DeltaUpdater
from tensorflow_dynemb.serving.static_export import export_static_saved_model

__all__ = ["DeltaExporter", "DeltaUpdater", "export_static_saved_model"]
