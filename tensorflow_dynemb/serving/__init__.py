"""Serving: `export_static_saved_model` (static_export.py) freezes every table a
signature reads into stock TF objects (frozen.py, keyed_random.py)."""

from tensorflow_dynemb.serving.static_export import export_static_saved_model

__all__ = ["export_static_saved_model"]
