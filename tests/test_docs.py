"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of one document run in order in one fresh process (a block may continue the
one before it, as the text then says), in an empty temporary directory, so that files
an example writes under a relative path land there. Their temporary files (`tempfile`)
go to a folder of their own, which must be empty when they end: an example cleans up. A block that cannot run here (it
needs a cluster, a GPU, another process, ...) is marked by an HTML comment on the line
right before it, naming the reason and where it is tested instead:

    <!-- not-run: needs a cluster; covered by tests/test_distributed.py -->

A block that needs a Redis server (docs/tables.md, "Redis") is marked

    <!-- needs-redis -->

and runs where redis-server and the op library's Redis table are available: the test
starts a server on a free port and writes `redis_config.json` for it into the block's
directory. Elsewhere the block is left out.

A document added to docs/ is picked up without changing this file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from typing import List, NamedTuple, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCS = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run\s*:?(.*?)-->\s*$")
NEEDS_REDIS = re.compile(r"^\s*<!--\s*needs-redis\s*-->\s*$")
# Seconds one document's blocks may take together.
TIMEOUT_S = 300

# Runs the blocks of argv[1] (JSON: [[document, first line, code], ...]) in order, in one
# namespace. Each block is compiled under the document's name with its code on the
# document's own line numbers, so a traceback points into the markdown. An example that
# asks for a device a default process lacks (`/CPU:1`) fails: its shard would not be
# where the text says.
_RUNNER = """
import json, sys, warnings
warnings.filterwarnings("error", message=r"(?s).*this process has no device")
namespace = {"__name__": "__main__"}
for document, line, code in json.loads(sys.argv[1]):
    exec(compile("\\n" * (line - 1) + code, document, "exec"), namespace)
    print(f"ran {document}:{line}", flush=True)
"""


class Block(NamedTuple):
    line: int  # the first line of code (1-based), after the opening fence
    code: str
    not_run: Optional[str]  # the reason of a not-run mark, "" for a mark without one
    needs_redis: bool = False  # marked <!-- needs-redis -->


def python_blocks(path: str) -> List[Block]:
    """The ```python blocks of a markdown file, dedented (blocks inside list items are
    indented), with the not-run mark on the line before each, if any."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.groups()
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if language == "python":
            previous = lines[i - 1] if i > 0 else ""
            mark = NOT_RUN.match(previous)
            code = "\n".join(line[len(indent):] for line in lines[i + 1:end])
            blocks.append(Block(i + 2, code + "\n", mark.group(1).strip() if mark else None,
                                bool(NEEDS_REDIS.match(previous))))
        i = end + 1
    return blocks


@pytest.mark.parametrize("document", DOCS)
def test_not_run_marks_name_a_reason(document):
    for block in python_blocks(os.path.join(ROOT, document)):
        if block.not_run is not None:
            assert len(block.not_run) >= 10, (
                f"{document}:{block.line}: a not-run mark must say why the block cannot run "
                f"here and where it is tested, got {block.not_run!r}"
            )


def test_the_parser_sees_blocks_and_marks(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n```python\na = 1\n```\n<!-- not-run: needs a cluster -->\n```python\n"
        "b = a\n```\n- item:\n  ```python\n  c = 2\n  ```\n```bash\nls\n```\n"
    )
    assert python_blocks(str(doc)) == [
        Block(3, "a = 1\n", None),
        Block(7, "b = a\n", "needs a cluster"),
        Block(11, "c = 2\n", None),
    ]


@pytest.mark.parametrize("document", [d for d in DOCS if any(
    b.not_run is None for b in python_blocks(os.path.join(ROOT, d)))])
def test_python_blocks_run(document, tmp_path):
    blocks = [b for b in python_blocks(os.path.join(ROOT, document)) if b.not_run is None]
    server = None
    if any(b.needs_redis for b in blocks):
        server = _redis_for_docs(tmp_path)
        if server is None:
            blocks = [b for b in blocks if not b.needs_redis]
    try:
        _run_blocks(document, blocks, tmp_path)
    finally:
        if server is not None:
            server.kill()


def _redis_for_docs(directory):
    """A redis-server for the needs-redis blocks and their `redis_config.json`, or None
    where Redis cannot run here."""
    import shutil

    from tensorflow_dynemb.tables.redis import redis_available
    from redis_util import RedisServer

    if not redis_available() or shutil.which("redis-server") is None:
        return None
    server = RedisServer(str(directory / "redis-data"))
    with open(directory / "redis_config.json", "w") as f:
        json.dump({"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"],
                   "redis_host_port": [server.port], "model_tag_runtime": "docs"}, f)
    return server


def _run_blocks(document, blocks, tmp_path):
    request = [(document, block.line, block.code) for block in blocks]
    # The examples' temporary files go to a folder of their own, which they must leave empty.
    temp = tmp_path / "TMPDIR"
    temp.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(temp))
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(request)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    ran = result.stdout.count("\nran ") + result.stdout.startswith("ran ")
    assert result.returncode == 0, (
        f"{document}: the block at line {blocks[min(ran, len(blocks) - 1)].line} failed:\n"
        f"{result.stderr[-6000:]}"
    )
    assert ran == len(blocks), result.stdout
    left = sorted(os.listdir(temp))
    assert not left, (
        f"{document}: the examples left temporary files {left}: an example that creates "
        "them must remove them (tempfile.TemporaryDirectory(), then .cleanup())"
    )
