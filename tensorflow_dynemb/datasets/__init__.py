"""Real data for demos and tests: MovieLens-100k ratings (`movielens`)."""

from tensorflow_dynemb.datasets.movielens import load_movielens_100k, movielens_100k_path

__all__ = ["load_movielens_100k", "movielens_100k_path"]
