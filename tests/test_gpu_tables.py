"""GPU tables in TensorFlow (docs/gpu.md).

Everywhere: which kernels the op library registers (a CPU-only build: none for the
GPU, nothing of CUDA linked; a CUDA build: every table op for the GPU, with int32 /
int64 keys and the host-memory arguments), and where a `de.Variable` puts its shard
tables (`tensorflow_dynemb.variable.sharding.table_devices`: string keys never on a GPU, said
once per variable).

With a GPU TensorFlow device and a CUDA build of the op library only (skipped
otherwise): GPU tables against CPU tables fed the same batches, checkpoints and
table files from a GPU table read by a CPU table, and out-of-memory as an error.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import tensorflow_dynemb as de
from tensorflow_dynemb import _ops
from tensorflow_dynemb.variable import sharding
from tensorflow_dynemb._ops import ops  # noqa: F401  (loads the op library)
from _tables_util import comparable, dtype_id, exported_dict, make_keys, make_values, rng_for

TABLE_OPS = [
    "DynembHashTable",
    "DynembTableFind",
    "DynembTableInsert",
    "DynembTableInsertAndEvict",
    "DynembTableAccum",
    "DynembTableAccumAndEvict",
    "DynembTableRemove",
    "DynembTableClear",
    "DynembTableSize",
    "DynembTableStats",
    "DynembTableExport",
    "DynembTableImport",
    "DynembTableSaveToFile",
    "DynembTableStageLoad",
    "DynembTableCommitLoad",
]
# The GPU kernel's key-dtype attribute, for the ops that have one.
KEY_ATTR = {
    "DynembHashTable": "key_dtype",
    **{op: "Tkey" for op in ("DynembTableFind", "DynembTableInsert",
                             "DynembTableInsertAndEvict", "DynembTableAccum",
                             "DynembTableAccumAndEvict", "DynembTableRemove",
                             "DynembTableExport", "DynembTableImport")},
}
# Arguments a GPU kernel keeps in host memory, besides the table handle.
HOST_ARGS = {
    "DynembTableSize": {"size"},
    "DynembTableStats": {"size", "capacity", "max_capacity", "load_factor", "inserts",
                         "lookups", "misses", "evictions"},
    "DynembTableSaveToFile": {"dirpath", "file_name", "save_id", "file_entry"},
    "DynembTableStageLoad": {"manifest_paths", "filepaths", "expected_save_id", "staged",
                             "save_ids"},
    "DynembTableCommitLoad": {"staged"},
}


def _kernels(op: str, device_type: str):
    return [k for k in kernels.get_registered_kernels_for_op(op).kernel
            if k.device_type == device_type]


def _build_info():
    from tensorflow_dynemb import _build_info as info
    return info


def _dynamic_symbols(undefined: bool):
    """The op library's dynamic symbols (`nm -D`), or skip without binutils."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, _ops.op_library_path()], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def _is_cuda_runtime_symbol(name: str) -> bool:
    return name.startswith(("cuda", "__cuda"))


# ----------------------------------------------------------------------------------------
# What the op library registers and links
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", TABLE_OPS)
def test_every_table_op_has_a_cpu_kernel(op):
    assert _kernels(op, "CPU"), op


@pytest.mark.skipif(_ops.gpu_kernels_built(), reason="the op library is a CUDA build")
def test_cpu_only_library_has_no_gpu_kernels_and_no_cuda():
    for op in TABLE_OPS + ["DynembPartition", "DynembKeyedRandom"]:
        assert not _kernels(op, "GPU"), op
    info = _build_info()
    assert info.GPU_KERNELS is False
    # Built as before CUDA support: TF's flags and nothing else of CUDA.
    assert not any("GOOGLE_CUDA" in f or "cuda" in f for f in info.COMPILE_FLAGS)
    # TensorFlow's, plus hiredis' where the Redis table is built (setup.py): nothing of CUDA.
    extra = [f for f in info.LINK_FLAGS if f not in info.TF_LINK_FLAGS]
    assert all(f in info.TF_LINK_FLAGS for f in info.LINK_FLAGS[: len(info.TF_LINK_FLAGS)])
    assert not any("cuda" in f.lower() for f in extra), extra
    assert bool(extra) == bool(getattr(info, "REDIS_TABLE", False)), extra
    assert not [s for s in _dynamic_symbols(undefined=True) + _dynamic_symbols(undefined=False)
                if _is_cuda_runtime_symbol(s)]


def test_op_library_exports_none_of_its_own_symbols():
    """The op library is built with hidden visibility (setup.py's OPS_VISIBILITY_FLAGS):
    TF finds its ops through registrations, so nothing of ours, TF's, TSL's or Abseil's
    is exported, and no call of the library's own functions goes through the PLT."""
    # Functions and objects in those namespaces, and their classes' vtables and typeinfo
    # (std's templates instantiated over our types stay exported: libstdc++'s visibility).
    namespaces = ("6dynemb", "10tensorflow", "3tsl", "4absl")
    own = tuple(f"{kind}{ns}" for ns in namespaces
                for kind in ("_ZN", "_ZNK", "_ZTVN", "_ZTIN", "_ZTSN"))
    exported = [s for s in _dynamic_symbols(undefined=False) if s.startswith(own)]
    assert not exported, exported[:10]
    assert any(f == "-fvisibility=hidden" for f in _build_info().COMPILE_FLAGS)


@pytest.mark.skipif(not _ops.gpu_kernels_built(), reason="the op library is CPU-only")
def test_cuda_library_registers_every_table_op_for_the_gpu():
    for op in TABLE_OPS:
        (kernel,) = _kernels(op, "GPU")
        constraints = {c.name: set(c.allowed_values.list.type) for c in kernel.constraint}
        if op in KEY_ATTR:
            assert constraints == {KEY_ATTR[op]: {tf.int32.as_datatype_enum,
                                                  tf.int64.as_datatype_enum}}, op
        else:
            assert constraints == {}, op
        assert set(kernel.host_memory_arg) == {"table_handle"} | HOST_ARGS.get(op, set()), op


@pytest.mark.skipif(not _ops.gpu_kernels_built(), reason="the op library is CPU-only")
def test_cuda_library_keeps_its_cuda_runtime_private():
    """cudart is linked statically and bound inside the library: nothing of it is
    taken from (or given to) TF's libraries, whose cudart is of TF's CUDA version."""
    assert not [s for s in _dynamic_symbols(undefined=True) if _is_cuda_runtime_symbol(s)]
    assert not [s for s in _dynamic_symbols(undefined=False) if _is_cuda_runtime_symbol(s)]


# ----------------------------------------------------------------------------------------
# Where a variable's shard tables go
# ----------------------------------------------------------------------------------------


@pytest.fixture
def fresh_placement_note(monkeypatch):
    """The once-per-process note not said yet; `set_built(flag)` fakes the build. The
    process is made to look like a machine with four GPUs, so that the GPU devices
    these tests name exist (a missing device is moved: tests/test_variable.py)."""
    monkeypatch.setattr(sharding, "_said_no_gpu_kernels", False)
    devices = ["/device:CPU:0"] + [f"/device:GPU:{i}" for i in range(4)]
    monkeypatch.setattr(
        sharding, "_local_devices", lambda: [tf.DeviceSpec.from_string(d) for d in devices]
    )

    def set_built(flag: bool):
        monkeypatch.setattr(_ops, "gpu_kernels_built", lambda: flag)

    return set_built


@pytest.mark.parametrize("built", [False, True])
def test_string_keys_go_to_the_cpu_of_each_gpu_device(fresh_placement_note, built):
    fresh_placement_note(built)
    devices = ["/GPU:0", "/CPU:0", "/job:ps/task:1/GPU:1", "/device:GPU:2"]
    placed, note = sharding.table_devices(devices, tf.string)
    assert placed == ["/CPU:0", "/CPU:0", "/job:ps/task:1/device:CPU:0", "/CPU:0"]
    assert note is not None and "/job:ps/task:1/GPU:1" in note


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string], ids=dtype_id)
def test_cpu_devices_are_kept_silently(fresh_placement_note, key_dtype):
    fresh_placement_note(False)
    devices = ["/CPU:0", "/job:ps/task:0/CPU:0"]
    assert sharding.table_devices(devices, key_dtype) == (devices, None)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64], ids=dtype_id)
def test_numeric_keys_stay_on_the_gpu(fresh_placement_note, key_dtype):
    fresh_placement_note(True)
    assert sharding.table_devices(["/GPU:0", "/GPU:1"], key_dtype) == (["/GPU:0", "/GPU:1"], None)


def test_missing_gpu_kernels_are_said_once_per_process(fresh_placement_note):
    fresh_placement_note(False)
    placed, note = sharding.table_devices(["/GPU:0"], tf.int64)
    assert placed == ["/GPU:0"] and "DYNEMB_CUDA=1" in note
    assert sharding.table_devices(["/GPU:1"], tf.int32) == (["/GPU:1"], None)


def _user_warnings(record):
    return [w for w in record if issubclass(w.category, UserWarning)]


def test_string_variable_on_gpus_is_placed_on_the_cpu_and_warns_once(fresh_placement_note):
    fresh_placement_note(_ops.gpu_kernels_built())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        var = de.Variable(tf.string, tf.float32, dim=2, devices=["/GPU:0", "/GPU:0"],
                          name="string_on_gpu")
        # Companions (optimizer slots, policy state) follow the placed devices.
        var.companion("slot", tf.float32, 2, 0.0)
    assert len(_user_warnings(record)) == 1
    assert "string_on_gpu" in str(_user_warnings(record)[0].message)
    assert var.devices == ["/CPU:0", "/CPU:0"]
    for table in var.tables:
        assert tf.DeviceSpec.from_string(table.resource_handle.device).device_type == "CPU"
    var.upsert(["a", "b"], [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(var.lookup(["b", "c"]).numpy(), [[3.0, 4.0], [0.0, 0.0]])


def test_numeric_variable_without_gpu_kernels_warns_once_per_process(fresh_placement_note):
    fresh_placement_note(False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = de.Variable(tf.int64, tf.float32, dim=1, devices=["/GPU:0"], name="a")
        second = de.Variable(tf.int64, tf.float32, dim=1, devices=["/GPU:0"], name="b")
    assert len(_user_warnings(record)) == 1
    # Kept as asked: TF's soft placement decides (the CPU, without GPU kernels).
    assert first.devices == second.devices == ["/GPU:0"]


# ----------------------------------------------------------------------------------------
# GPU tables at work (a GPU and a CUDA build of the op library)
# ----------------------------------------------------------------------------------------

needs_gpu_tables = pytest.mark.skipif(
    not (_ops.gpu_kernels_built() and tf.config.list_logical_devices("GPU")),
    reason="needs a GPU TensorFlow device and the op library's GPU kernels "
           "(DYNEMB_CUDA=1, docs/gpu.md)",
)
GPU_KEY_DTYPES = [tf.int32, tf.int64]
GPU_VALUE_DTYPES = [tf.float32, tf.float16, tf.bfloat16, tf.int8, tf.int64, tf.bool]


def _table_pair(key_dtype, value_dtype, default, **kwargs):
    """The same table on the CPU and on the GPU."""
    with tf.device("/CPU:0"):
        cpu = de.HkvHashTable(key_dtype, value_dtype, default, **kwargs)
    with tf.device("/GPU:0"):
        gpu = de.HkvHashTable(key_dtype, value_dtype, default, **kwargs)
    assert tf.DeviceSpec.from_string(gpu.resource_handle.device).device_type == "GPU"
    return cpu, gpu


def _assert_same_content(cpu, gpu):
    assert int(cpu.size()) == int(gpu.size())
    want, got = exported_dict(*cpu.export()), exported_dict(*gpu.export())
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"key {k!r}")


@needs_gpu_tables
@pytest.mark.parametrize("key_dtype", GPU_KEY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("value_dtype", GPU_VALUE_DTYPES, ids=dtype_id)
def test_gpu_table_agrees_with_cpu_table(key_dtype, value_dtype):
    rng = rng_for("gpu-vs-cpu", key_dtype.name, value_dtype.name)
    dim = 7
    default = make_values(rng, value_dtype, (dim,))
    cpu, gpu = _table_pair(key_dtype, value_dtype, default, init_capacity=64,
                           max_capacity=1 << 20, max_hbm_for_values=1 << 12)
    keys = make_keys(rng, key_dtype, 600)
    values = make_values(rng, value_dtype, (600, dim))
    dup = np.concatenate([keys[:100], keys[:100]])  # duplicates: the last row wins
    dup_values = make_values(rng, value_dtype, (200, dim))
    for table in (cpu, gpu):
        table.insert(keys, values)
        table.insert(dup, dup_values)
        table.accum(keys[50:150], values[50:150], exists=np.arange(100) % 2 == 0)
        table.remove(keys[500:])
    _assert_same_content(cpu, gpu)
    probe = np.concatenate([keys[::3], make_keys(rng, key_dtype, 50, edges=False)])
    (want, want_exists), (got, got_exists) = (
        t.lookup(probe, return_exists=True) for t in (cpu, gpu))
    np.testing.assert_array_equal(comparable(got), comparable(want))
    np.testing.assert_array_equal(got_exists.numpy(), want_exists.numpy())
    for name in ("size", "max_capacity", "inserts"):
        assert int(gpu.stats()[name]) == int(cpu.stats()[name]), name
    gpu.clear()
    assert int(gpu.size()) == 0


@needs_gpu_tables
@pytest.mark.parametrize("key_dtype", GPU_KEY_DTYPES, ids=dtype_id)
def test_gpu_table_evicts_as_the_cpu_table(key_dtype):
    rng = rng_for("gpu-evict", key_dtype.name)
    cpu, gpu = _table_pair(key_dtype, tf.float32, [0.0, 0.0], init_capacity=8,
                           max_capacity=64, evict_strategy="customized")
    keys = make_keys(rng, key_dtype, 200, edges=False)
    values = make_values(rng, tf.float32, (200, 2))
    scores = rng.permutation(200).astype(np.int64)  # distinct: one right answer
    evicted = [t.insert_and_evict(keys, values, scores=scores) for t in (cpu, gpu)]
    (want_keys, _, want_scores), (got_keys, _, got_scores) = evicted
    assert sorted(got_keys.numpy().tolist()) == sorted(want_keys.numpy().tolist())
    assert sorted(got_scores.numpy().tolist()) == sorted(want_scores.numpy().tolist())
    _assert_same_content(cpu, gpu)


@needs_gpu_tables
def test_gpu_variable_checkpoint_restores_on_the_cpu(tmp_path):
    """Checkpoints are device-neutral: a GPU-trained variable restores on the CPU."""
    rng = rng_for("gpu-checkpoint")
    keys = make_keys(rng, tf.int64, 300)
    values = make_values(rng, tf.float32, (300, 4))
    gpu_var = de.Variable(tf.int64, tf.float32, dim=4, devices=["/GPU:0", "/GPU:0"])
    gpu_var.upsert(keys, values)
    prefix = tf.train.Checkpoint(v=gpu_var).write(str(tmp_path / "ckpt"))
    cpu_var = de.Variable(tf.int64, tf.float32, dim=4, devices=["/CPU:0"])
    tf.train.Checkpoint(v=cpu_var).read(prefix).assert_consumed()
    want, got = exported_dict(*gpu_var.export()), exported_dict(*cpu_var.export())
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@needs_gpu_tables
def test_gpu_table_file_loads_into_a_cpu_table_and_back(tmp_path):
    rng = rng_for("gpu-files")
    keys = make_keys(rng, tf.int64, 500)
    values = make_values(rng, tf.float32, (500, 3))
    cpu, gpu = _table_pair(tf.int64, tf.float32, [0.0] * 3, init_capacity=16,
                           max_capacity=1 << 16)
    gpu.insert(keys, values)
    gpu.save_to_file_system(str(tmp_path), file_name="gpu.dynemb", chunk_rows=64)
    cpu.load_from_file_system(str(tmp_path), file_name="gpu.dynemb", chunk_rows=100)
    _assert_same_content(cpu, gpu)
    cpu.remove(keys[:100])
    cpu.save_to_file_system(str(tmp_path), file_name="cpu.dynemb")
    gpu.load_from_file_system(str(tmp_path), file_name="cpu.dynemb", chunk_rows=37)
    _assert_same_content(cpu, gpu)


@needs_gpu_tables
def test_gpu_out_of_memory_is_an_error():
    # 2^31 slots of 16 KiB rows (32 TiB): no GPU has them, and nothing may abort.
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with tf.device("/GPU:0"):
            table = de.HashTable(tf.int64, tf.float32, [0.0] * 4096, init_size=1 << 30)
            table.size()
