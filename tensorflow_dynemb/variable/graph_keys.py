"""`de.GraphKeys`: the names of TF1 graph collections for `de.Variable`s (TFRA's)."""

from __future__ import annotations

__all__ = ["GraphKeys"]


class GraphKeys:
    """Names of graph collections that hold `de.Variable`s, as TFRA defines them.

    As in TFRA 0.8.1, a `de.Variable` is added to no collection by itself: it holds
    tables, not a value, so a collection holding it would not survive
    `tf.compat.v1.train.import_meta_graph`. Code that selects variables by collection
    (`de.warm_start` with a regular expression) needs them added explicitly:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> with tf.Graph().as_default() as graph:
    ...     v = de.get_variable("user_emb", dim=4)
    ...     tf.compat.v1.add_to_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, v)
    ...     [x.name for x in tf.compat.v1.get_collection(
    ...         de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, scope="user.*")]
    ['user_emb']
    """

    # Every de.Variable the user collects.
    DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
    # The trainable subset of those.
    TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"
