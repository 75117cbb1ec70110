"""What fresh memory costs this host: first touch against reuse, 4 KiB against 2 MiB pages.

    python benchmarks/page_faults.py [--mib 256] [--rounds 3] [--pause 0]

A growing table's new rows are fresh memory: the kernel zeroes each new page at its first
write (one fault per 4 KiB page, or per 2 MiB with transparent huge pages, which large
tables ask for: docs/tables.md "Huge pages"). On a virtual machine the host may also have
to back the page, which can cost far more than the zeroing: a guest whose balloon driver
reports free memory to the host (virtio-balloon free page reporting, order 9 = 2 MiB in
`/sys/module/page_reporting/parameters/page_reporting_order`) hands every free 2 MiB
block back within seconds, so nearly every fresh huge page is one the host must back
again. This maps `--mib` MiB of anonymous memory, advised for huge pages or against them,
writes one byte per 4 KiB, unmaps it, and repeats `--rounds` times per kind, each round
`--pause` seconds after the last: round 0 takes whatever free memory the kernel gives,
and the rounds after it, with no pause, mostly reuse what the round before released.
Prints GB/s per round (docs/benchmarks.md, "Fresh memory on this VM"). Linux only.
"""

from __future__ import annotations

import argparse
import mmap
import time

import numpy as np

PAGE = 4096


def touch(mib: int, huge: bool) -> float:
    """Seconds to write one byte per 4 KiB page of a fresh `mib` MiB mapping."""
    size = mib << 20
    mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mem.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        pages = np.frombuffer(mem, dtype=np.uint8)[::PAGE]
        start = time.perf_counter()
        pages[:] = 1
        seconds = time.perf_counter() - start
        del pages  # the view must go before the mapping can close
    finally:
        mem.close()
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="MiB mapped and touched per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per page size")
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds to wait before each round (the host may reclaim freed memory meanwhile)")
    args = p.parse_args()
    if args.mib <= 0 or args.rounds <= 0 or args.pause < 0:
        raise SystemExit(f"--mib and --rounds must be > 0 and --pause >= 0, got "
                         f"{args.mib}, {args.rounds}, {args.pause}")
    for huge in (True, False):
        kind = "2 MiB pages" if huge else "4 KiB pages"
        for r in range(args.rounds):
            time.sleep(args.pause)
            seconds = touch(args.mib, huge)
            print(f"{kind}, round {r}: {args.mib} MiB in {seconds * 1e3:.1f} ms "
                  f"({(args.mib << 20) / seconds / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
