"""Gradient accumulation for `de.Variable`s: Keras 3's `gradient_accumulation_steps`.

A Keras 3 optimizer created with `gradient_accumulation_steps=N` updates its variables
every N-th step only, with the average of the gradients of the N steps (the sum
divided by N, whatever the number of steps a variable got a gradient in), after
clipping that average, and counts its `iterations` in updates (`_iterations // N`).
The wrapper keeps the same schedule for the dense variables (the inner optimizer
accumulates them itself) and for the rows of `de.Variable`s:

- every step adds each key's summed gradient and occurrence count to the variable's
  *accumulator*, a companion `de.Variable` of `dim + 1` columns (slots.py
  `SlotStore.accumulator_of`; saved with the optimizer), so the keys of the N steps
  need not be known in advance;
- the N-th step drains every accumulator: its keys, their average gradient (clipped
  with the inner optimizer's `clipnorm` / `clipvalue`), their counts (for admission)
  and their rows read now, then the optimizer's rule updates them once, as a step
  without accumulation would, with Keras' step number (`iterations + 1`, counted in
  updates) and learning rate (schedules at the raw step counter).

The order of the additions is Keras' (`acc + g`, then `(acc + g) / N`), so the rows
equal those of a dense variable trained by the same optimizer, row for row.
`global_clipnorm` couples every gradient of a step, the dense ones that the inner
optimizer accumulates included, so it is refused with accumulation. Gradients are
accumulated in float32 for float16 / bfloat16 variables (float32 / float64 in their
own dtype).
"""

from __future__ import annotations

from typing import Any, Callable, List

import tensorflow as tf

from tensorflow_dynemb.training.slots import SlotStore

__all__ = ["GradientAccumulation", "accumulation_steps"]


def accumulation_steps(optimizer) -> int:
    """The optimizer's `gradient_accumulation_steps` (0: none), checked for options the
    sparse part cannot reproduce with it."""
    steps = getattr(optimizer, "gradient_accumulation_steps", None) or 0
    if steps and getattr(optimizer, "global_clipnorm", None):
        raise ValueError(
            f"{type(optimizer).__name__}(gradient_accumulation_steps={steps}, "
            f"global_clipnorm={optimizer.global_clipnorm}) is not supported with "
            "de.Variables: the global norm would couple the de.Variables' gradients with "
            "the dense ones the inner optimizer accumulates. Use `clipnorm` or `clipvalue`."
        )
    return int(steps)


def _accumulator_dtype(dtype: tf.dtypes.DType) -> tf.dtypes.DType:
    return dtype if dtype in (tf.float32, tf.float64) else tf.float32


class GradientAccumulation:
    """The accumulators of one optimizer wrapper's `de.Variable`s (see the module
    docstring)."""

    def __init__(self, steps: int, slot_store: SlotStore, optimizer_name: str, clip):
        self.steps = steps
        self._slot_store = slot_store
        self._optimizer_name = optimizer_name
        # `list of grads -> list of grads`: the inner optimizer's per-gradient clipping,
        # applied to the average at an update.
        self._clip = clip

    def accumulator_of(self, params):
        return self._slot_store.accumulator_of(
            params, _accumulator_dtype(params.value_dtype), self._optimizer_name
        )

    def add(self, update) -> List[Any]:
        """Adds one step's `SparseGradient` of a variable to its accumulator; returns
        the write op (None eagerly)."""
        accumulator = self.accumulator_of(update.params)
        dtype = accumulator.value_dtype
        summed = tf.concat(
            [tf.cast(update.grad, dtype), tf.cast(update.counts, dtype)[:, tf.newaxis]], 1
        )
        # Keras' order: the new gradient plus what was accumulated.
        return accumulator.upsert(update.keys, summed + accumulator.lookup(update.keys))

    def drain(self, params, make_gradient: Callable[..., Any]):
        """The average gradient accumulated for `params` as a `SparseGradient` (made by
        `make_gradient(params, keys, old_rows, exists, grad, counts)`), with the rows as
        they are now; empties the accumulator."""
        accumulator = self.accumulator_of(params)
        keys, summed = accumulator.export()
        clear = accumulator.clear()
        with tf.control_dependencies([] if clear is None else [clear]):
            grad = tf.cast(summed[:, : params.dim] / self.steps, params.value_dtype)
            counts = tf.cast(summed[:, params.dim], tf.int32)
            rows, exists = params.lookup(keys, return_exists=True)
        return make_gradient(params, keys, rows, exists, grad, counts)

    def step(self, sparse: list, update_now: tf.Tensor, make_gradient, apply_fn) -> List[Any]:
        """Accumulates this step's gradients; when `update_now`, drains every
        accumulator, clips the averages and applies them with `apply_fn(gradients)`.
        Returns the write ops."""
        writes = [op for op in (self.add(update) for update in sparse) if op is not None]

        def update():
            with tf.control_dependencies(writes):
                drained = [
                    self.drain(params, make_gradient)
                    for params, _ in self._slot_store.accumulators()
                ]
                clipped = self._clip([d.grad for d in drained])
                drained = [d._replace(grad=g) for d, g in zip(drained, clipped)]
                applied = apply_fn(drained)
            with tf.control_dependencies(applied):
                return tf.constant(True)

        if tf.executing_eagerly():
            if bool(update_now):
                update()
            return writes
        with tf.control_dependencies(writes):
            done = tf.cond(update_now, update, lambda: tf.constant(False))
        return writes + [done]
