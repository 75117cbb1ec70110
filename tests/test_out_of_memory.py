"""A table running out of memory is an error, not the end of the process: with the
address space capped (RLIMIT_AS), inserts that need more memory raise
ResourceExhaustedError naming it, the table keeps every entry it held and the rows of the
batch applied before, its size agrees with what lookups find, and once memory is back the
same batch goes in. Each case runs in a fresh interpreter (the cap is per process).

Only the table's own memory is tested: TensorFlow's allocator is not exception-safe (it
throws std::bad_alloc while holding its lock), so its failures end the process, by
design of this package too (catching them would deadlock the next deallocation)."""

from __future__ import annotations

import platform

import pytest

from _tables_util import run_python

# Each case fills hundreds of MiB until an insert fails: slow, run by CI (--run-slow).
pytestmark = [
    pytest.mark.skipif(platform.system() != "Linux", reason="RLIMIT_AS is Linux's"),
    pytest.mark.slow,
]

# argv[1]: "int64" or "string". Fills a table in batches under a cap of 400 MiB more
# address space than the process has, until an insert runs out of memory.
FILL_UNTIL_OUT_OF_MEMORY = """
import resource, sys
import numpy as np
import tensorflow as tf
import tensorflow_dynemb as de

def cap(extra_mib):
    status = open("/proc/self/status").read().split("VmSize:")[1].split()[0]
    used = int(status) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (used + (extra_mib << 20), resource.RLIM_INFINITY))

def uncap():
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

kind = sys.argv[1]
if kind == "int64":
    n, dim = 1 << 20, 16
    table = de.HashTable(tf.int64, tf.float32, [0.0] * dim)
    batches = [tf.range(i * n, (i + 1) * n, dtype=tf.int64) for i in range(40)]
else:  # keys longer than the small-string buffer: each allocates in its row
    n, dim = 1 << 18, 2
    table = de.HashTable(tf.string, tf.float32, [0.0] * dim)
    batches = [tf.strings.join(["feature-with-a-long-name-", tf.strings.as_string(
        tf.range(i * n, (i + 1) * n, dtype=tf.int64))]) for i in range(40)]
values = [tf.fill([n, dim], float(i)) for i in range(40)]

cap(400)
failed = None
for i in range(len(batches)):
    try:
        table.insert(batches[i], values[i])
    except tf.errors.ResourceExhaustedError as e:
        assert "out of memory" in str(e), str(e)
        failed = i
        break
uncap()
assert failed is not None and failed >= 1, failed

for i in range(failed):
    found, exists = table.lookup(batches[i], return_exists=True)
    assert bool(tf.reduce_all(exists)), i
    assert bool(tf.reduce_all(found == float(i))), i
found, exists = table.lookup(batches[failed], return_exists=True)
partly = int(tf.reduce_sum(tf.cast(exists, tf.int64)))
assert int(table.size()) == failed * n + partly, (int(table.size()), failed, partly)
assert bool(tf.reduce_all(tf.boolean_mask(found, exists) == float(failed)))

table.insert(batches[failed], values[failed])  # memory is back
assert int(table.size()) == (failed + 1) * n
found = table.lookup(batches[failed])
assert bool(tf.reduce_all(found == float(failed)))
print("failed at batch", failed, "after", partly, "of its keys")
"""

@pytest.mark.parametrize("key_kind", ["int64", "string"])
def test_inserts_that_run_out_of_memory_raise_and_keep_the_table(tmp_path, key_kind):
    script = tmp_path / "fill.py"
    script.write_text(FILL_UNTIL_OUT_OF_MEMORY)
    out = run_python(str(script), key_kind).stdout
    assert "failed at batch" in out

