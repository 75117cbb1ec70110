"""Regenerates the end-to-end tables of docs/benchmarks.md (and PNG plots) from results.

    python benchmarks/report.py [--results benchmarks/results] [--doc docs/benchmarks.md]
        [--plots docs/img] [--check]

Reads the newest `keras_train_*.json` per (TF version, layout, regime, optimizer, MLP) and the newest
`train_state_*.json` per TF version in `--results`, renders Markdown tables and writes
them into `--doc` between the marker lines `<!-- report:NAME -->` and
`<!-- /report:NAME -->` (NAME: `keras_train`, `train_state`); text outside the markers is
left alone. With matplotlib installed it also writes `keras_train.png`,
`train_state.png` and, from the newest `scale_*.json`, `scale.png` into `--plots`
(skipped, with a note, without it). `--check` prints the tables instead of writing
anything.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import keras_train  # noqa: E402  (its comparisons and targets; TF is imported lazily there)


def _load(pattern, results):
    out = []
    for path in sorted(glob.glob(os.path.join(results, pattern))):
        with open(path) as f:
            rec = json.load(f)
        rec["_path"] = os.path.relpath(path, ROOT)
        out.append(rec)
    return out


def _newest(records, key):
    best = {}
    for rec in records:
        k = key(rec)
        if k not in best or rec["date"] > best[k]["date"]:
            best[k] = rec
    return [best[k] for k in sorted(best)]


def _med(xs):
    """The median (the mean of the middle two for an even count)."""
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def _spread(xs, fmt="{:.0f}"):
    xs = sorted(xs)
    if not xs:
        return "—"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(_med(xs))} ({fmt.format(xs[0])}–{fmt.format(xs[-1])})"


# The implementations keras_train.py runs, in the tables' and the plot's order.
TRAIN_IMPLS = (
    ("ours", "ours"),
    ("tfra", "TFRA 0.8.1"),
    ("keras-vocab", "IntegerLookup + Embedding"),
    ("keras-hashed", "Hashing(2**20) + Embedding"),
    ("ceiling", "no embedding (ceiling)"),
)
# (summary key of the per-round ratios, its label, target or None): keras_train.py's
# comparisons of ours with the implementations above.
TRAIN_RATIOS = tuple(
    (key, label, target)
    for a, b, (key, _), label, target, _ in keras_train.COMPARISONS
    if a == "ours" and b in dict(TRAIN_IMPLS)
)


def _ratio_cell(ratios, target):
    """`median (min–max)`, with the verdict on the median and on every round."""
    if not ratios:
        return "—"
    med = _med(ratios)
    cell = f"{med:.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
    if target is None:
        return cell
    verdict = "PASS" if med >= target else "**FAIL**"
    every = "every round" if min(ratios) >= target else "not every round"
    return f"{cell} {verdict}, {every}"


def keras_train_table(records):
    """One row per run: examples/s per implementation (median and range of the
    rounds) and the per-round ratios of ours over each other implementation."""
    rows = [
        "| TF / Keras | layout | regime | "
        + " | ".join(f"{label} examples/s" for _, label in TRAIN_IMPLS)
        + " | "
        + " | ".join(f"{label} per round{'' if t is None else f' (target ≥ {t:g})'}"
                     for _, label, t in TRAIN_RATIOS)
        + " | load start→end | file |",
        "|---|---|---|" + "---:|" * len(TRAIN_IMPLS) + "---|" * len(TRAIN_RATIOS) + "---|---|",
    ]
    for rec in records:
        s = rec["summary"]
        keras = "tf_keras" if rec.get("legacy_keras") else "Keras 3"
        regime = rec.get("regime", "growing")
        if rec.get("optimizer", "adam") != "adam":
            regime += f", {rec['optimizer']}"
        if rec.get("mlp", "64,32") != "64,32":
            regime += f", MLP {rec['mlp']}"
        if rec.get("batch", 4096) != 4096:
            regime += f", batch {rec['batch']}"
        rates = [_spread(s.get(impl, {}).get("examples_per_s", [])) for impl, _ in TRAIN_IMPLS]
        ratios = [_ratio_cell(s.get(key, []), target) for key, _, target in TRAIN_RATIOS]
        rows.append(
            f"| {rec['tf']} / {keras} | {rec.get('layout', '')} | {regime} | "
            f"{' | '.join(rates)} | {' | '.join(ratios)} | "
            f"{rec.get('load_start')}→{rec.get('load_end')} | `{rec['_path']}` |"
        )
    return "\n".join(rows)


def train_state_table(records):
    rows = []
    for rec in records:
        s = rec["summary"]
        payload = s["payload_bytes_per_key"]
        ours, tfra, floor = s.get("ours", {}), s.get("tfra", {}), s.get("dense", {})
        keys = next((r["keys"] for r in rec["runs"] if "keys" in r), None)
        dim = next((r["dim"] for r in rec["runs"] if "dim" in r), None)
        rows.append(
            f"TF {rec['tf']}, {keys:,} keys, dim {dim}, payload {payload} B/key (key + 3 × dim "
            f"float32), {rec['date']}, load {rec.get('load_start')}→{rec.get('load_end')}, "
            f"`{rec['_path']}`; median (min–max) of the rounds:\n"
        )
        # "TF's writer alone": dense variables of TFRA's bytes through the same
        # tf.train.Checkpoint calls (train_state.py's `dense`), where the run has them.
        rows.append("| measure | ours | TFRA | TF's writer alone | ours / TFRA | ours / payload |")
        rows.append("|---|---:|---:|---:|---:|---:|")

        def line(label, field, scale, fmt, payload_ratio):
            a, b, c = ours.get(field, []), tfra.get(field, []), floor.get(field, [])
            ra = f"{_med(a) / _med(b):.2f}×" if a and b else "—"
            rp = f"{_med(a) / payload:.2f}×" if (a and payload_ratio) else "—"
            spreads = [_spread([x / scale for x in v], fmt) for v in (a, b, c)]
            rows.append(f"| {label} | {' | '.join(spreads)} | {ra} | {rp} |")

        line("resident bytes per key (RSS delta)", "bytes_per_key", 1, "{:.1f}", True)
        line("checkpoint save, M keys/s", "save_keys_per_s", 1e6, "{:.2f}", False)
        line("checkpoint restore, M keys/s", "restore_keys_per_s", 1e6, "{:.2f}", False)
        line("checkpoint files, bytes per key", "file_bytes_per_key", 1, "{:.1f}", True)
        line("save's peak memory beyond the state, bytes per key", "save_peak_extra_bytes_per_key", 1,
             "{:.1f}", True)
        line("restore's peak memory (the restored state included), bytes per key",
             "restore_peak_bytes_per_key", 1, "{:.1f}", True)
        verdicts = _state_verdicts(rec)
        if verdicts:
            rows.append("")
            rows.append("| target | value | verdict |")
            rows.append("|---|---:|---|")
            for v in verdicts:
                rows.append(f"| {v['target']} | {v['value']:.2f} | {'PASS' if v['pass'] else '**FAIL**'} |")
        rows.append("")
    return "\n".join(rows).rstrip()


def _state_verdicts(rec):
    """The train_state targets, recomputed from the runs (medians of the rounds; the
    throughput ratios per round, both children of a round having run back to back)."""
    s = rec["summary"]
    payload = s["payload_bytes_per_key"]
    ours, tfra = s.get("ours", {}), s.get("tfra", {})
    out = []
    if ours.get("bytes_per_key"):
        out.append({"target": "memory ≤ 1.3 × payload", "value": _med(ours["bytes_per_key"]) / payload})
        out[-1]["pass"] = out[-1]["value"] <= 1.3
        if tfra.get("bytes_per_key"):
            v = _med(ours["bytes_per_key"]) / _med(tfra["bytes_per_key"])
            out.append({"target": "memory ≤ 0.5 × TFRA", "value": v, "pass": v <= 0.5})
    if ours.get("file_bytes_per_key"):
        v = _med(ours["file_bytes_per_key"]) / payload
        out.append({"target": "checkpoint files ≤ 1.1 × payload", "value": v, "pass": v <= 1.1})
    runs = [r for r in rec["runs"] if r.get("mode") == "checkpoint" and "error" not in r]
    for field, label in (("save_keys_per_s", "save"), ("restore_keys_per_s", "restore")):
        ratios = []
        for rnd in sorted({r["round"] for r in runs}):
            a = [r[field] for r in runs if r["round"] == rnd and r["impl"] == "ours"]
            b = [r[field] for r in runs if r["round"] == rnd and r["impl"] == "tfra"]
            if a and b:
                ratios.append(a[0] / b[0])
        if ratios:
            v = _med(ratios)
            out.append({"target": f"checkpoint {label} ≥ 5 × TFRA (per round: "
                                  f"{', '.join(f'{x:.2f}' for x in sorted(ratios))})",
                        "value": v, "pass": v >= 5})
    return out


def plots(train, state, outdir):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: tables only, no plots")
        return []
    os.makedirs(outdir, exist_ok=True)
    written = []
    if train:
        fig, ax = plt.subplots(figsize=(10, 4))
        labels = [f"TF {rec['tf']}{' tf_keras' if rec.get('legacy_keras') else ''}\n"
                  f"{rec.get('layout')}, {rec.get('regime', 'growing')}"
                  f"{'' if rec.get('optimizer', 'adam') == 'adam' else ', ' + rec['optimizer']}"
                  f"{'' if rec.get('mlp', '64,32') == '64,32' else chr(10) + 'MLP ' + rec['mlp']}"
                  for rec in train]
        present = [(impl, label) for impl, label in TRAIN_IMPLS
                   if any(impl in rec["summary"] for rec in train)]
        width = 0.8 / max(1, len(present))
        x = range(len(labels))
        for k, (impl, label) in enumerate(present):
            medians = [(rec["summary"].get(impl, {}).get("median") or 0) / 1e3 for rec in train]
            offset = (k - (len(present) - 1) / 2) * width
            ax.bar([i + offset for i in x], medians, width, label=label)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("k examples/s (median)")
        ax.set_title("Keras model.fit, 26 features, dim 16, batch 4096 (Adam, MLP 64-32 unless named)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(outdir, "keras_train.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    if state:
        rec = state[-1]
        s = rec["summary"]
        fields = [("bytes_per_key", "RSS B/key", 1), ("file_bytes_per_key", "ckpt B/key", 1),
                  ("save_keys_per_s", "save M keys/s ×100", 1e4), ("restore_keys_per_s", "restore M keys/s ×100", 1e4)]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        x = range(len(fields))
        for off, impl, label in ((-0.2, "ours", "tensorflow_dynemb"), (0.2, "tfra", "TFRA 0.8.1")):
            vals = [(_med(s.get(impl, {}).get(f, [])) or 0) / sc for f, _, sc in fields]
            ax.bar([i + off for i in x], vals, 0.4, label=label)
        ax.axhline(s["payload_bytes_per_key"], color="gray", linestyle="--", linewidth=0.8, label="payload B/key")
        ax.set_xticks(list(x))
        ax.set_xticklabels([l for _, l, _ in fields], fontsize=8)
        ax.set_title(f"Adam-trained state, TF {rec['tf']}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(outdir, "train_state.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def scale_plot(records, outdir):
    """docs/img/scale.png from the newest `scale_*.json`: seconds per 1M inserts (wall,
    process CPU, user CPU) and RSS growth against keys inserted, per part."""
    if not records:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 (matplotlib.ticker below)
    except ImportError:
        print("matplotlib not installed: no scale plot")
        return []
    rec = max(records, key=lambda r: r["date"])
    parts = [(name, p) for name, p in rec["parts"].items() if p.get("windows")]
    fig, axes = plt.subplots(2, len(parts), figsize=(5 * len(parts), 6), sharex="col", squeeze=False)
    for col, (name, part) in enumerate(parts):
        ws = part["windows"]
        x = [w["inserted"] / 1e6 for w in ws]
        ax = axes[0][col]
        for field, label in (("s_per_1m", "wall"), ("cpu_s_per_1m", "CPU (user + system)"),
                             ("user_s_per_1m", "user CPU")):
            if field in ws[0]:
                ax.plot(x, [w[field] for w in ws], label=label, linewidth=1)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel("seconds per 1M inserts")
        title = f"HkvHashTable, max_capacity {part['cap'] / 1e6:g}M" if part.get("cap") else "HashTable (unbounded)"
        ax.set_title(f"{title}, dim {part['dim']}", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[1][col]
        ax.plot(x, [w["rss_delta"] / 2**30 for w in ws], label="RSS growth")
        if part.get("rss_delta_trimmed") is not None:
            ax.plot([x[-1]], [part["rss_delta_trimmed"] / 2**30], "o", markersize=4,
                    label="at the end, after malloc_trim")
        if part.get("memory_bound_bytes"):
            ax.axhline(part["memory_bound_bytes"] / 2**30, color="gray", linestyle="--", linewidth=0.8,
                       label="documented bound")
        ax.set_ylabel("GiB")
        ax.set_xlabel("keys inserted (millions)")
        ax.legend(fontsize=7)
    fig.suptitle(f"benchmarks/scale.py, TF {rec['tf']}, {rec['date']}, load {rec.get('load_start')}"
                 f"\u2192{rec.get('load_end')}", fontsize=9)
    fig.tight_layout()
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "scale.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def replace_section(text, name, body):
    pattern = re.compile(rf"(<!-- report:{name} -->\n)(?:.*?\n)?(<!-- /report:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"marker <!-- report:{name} --> ... <!-- /report:{name} --> not found in the doc")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--plots", default=os.path.join(ROOT, "docs", "img"))
    p.add_argument("--check", action="store_true")
    args = p.parse_args()

    train = _newest(_load("keras_train_*.json", args.results),
                    lambda r: (r["tf"], r.get("layout", ""), r.get("regime", "growing"),
                               r.get("optimizer", "adam"), r.get("mlp", "64,32"),
                               r.get("batch", 4096)))
    state = _newest(_load("train_state_*.json", args.results), lambda r: r["tf"])
    sections = {"keras_train": keras_train_table(train), "train_state": train_state_table(state)}
    if args.check:
        for name, body in sections.items():
            print(f"== {name}\n{body}\n")
        return
    with open(args.doc) as f:
        text = f.read()
    for name, body in sections.items():
        text = replace_section(text, name, body)
    with open(args.doc, "w") as f:
        f.write(text)
    print(f"updated {os.path.relpath(args.doc, ROOT)}")
    for path in plots(train, state, args.plots) + scale_plot(_load("scale_*.json", args.results), args.plots):
        print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
