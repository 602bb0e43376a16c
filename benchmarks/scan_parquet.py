"""Scanner benchmark: a 1,000,000-row SWE-Smith-shaped parquet, 5,000 distinct images, 8 nodes.

    python benchmarks/scan_parquet.py [--rows 1000000] [--images 5000] [--repeat 5]
                                      [--snapshot realistic|independent] [--report]

The snapshot (--snapshot): by default "realistic", 8 nodes as `kubectl get nodes -o json` lists
them, each holding about 4,800 of the 5,000 images: every image under its repo digest and its tag,
beside the cluster's own images; about 3 % of the images were built on no node and each node lacks
about 1 % more, so about a tenth of the rows are dropped. "independent": each node holding each
image with a chance of 95 %, one name an image, so a third of the rows are dropped (the figures
in docs/benchmarks.md before 2026-12-06). --report: the timed scan also writes --report and
--missing-images.

Reports, measured in the same run on the same file:
- the whole `image-preflight scan` process / pyarrow's own read + write of the file as a process
  of its own (target <= 2), and against the read + write timed inside this process; both
  processes run with their bytecode compiled, as an installed package runs;
- naive per-row render + YAML parse (extrapolated from a sample) / the scan (target >= 20).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "swe-smith" / "job.yaml"
NODES = 8


def make_dataset(path: Path, rows: int, images: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    names = [f"swesmith.x86_64.owner{i % 97}__repo{i}.{i * 2654435761 % 16**8:08x}" for i in range(images)]
    pick = rng.integers(0, images, rows)
    image_name = pa.DictionaryArray.from_arrays(pa.array(pick, pa.int32()), pa.array(names)).cast(pa.string())
    ids = pa.array([f"inst-{i:07d}" for i in range(rows)])
    table = pa.table(
        {
            "instance_id": ids,
            "problem_statement": _statements(rng, ids),
            "image_name": image_name,
            "repo": image_name,
            "FAIL_TO_PASS": pa.array([["tests/test_x.py::test_a"]] * rows, pa.list_(pa.string())),
            "PASS_TO_PASS": pa.array([["tests/test_x.py::test_b", "tests/test_x.py::test_c"]] * rows),
            "data_source": pa.array(["swe-smith"] * rows),
            "data_id": ids,
        }
    )
    pq.write_table(table, path)
    return names


def _statements(rng: np.random.Generator, ids: pa.Array) -> pa.Array:
    """A distinct ~1 KB issue text per row, built from shared sentences as real ones are."""
    sentences = pa.array(
        [f"Calling helper_{i}() with a {w} argument raises {e} instead of returning the parsed value. "
         for i, (w, e) in enumerate((w, e) for w in ("empty", "nested", "unicode", "large", "negative", "null",
                                                     "quoted", "binary") for e in ("KeyError", "TypeError",
                                                     "ValueError", "IndexError", "AttributeError"))] * 5
    )
    parts = [pa.array(["Bug report for "] * len(ids)), ids, pa.array([": "] * len(ids))]
    for _ in range(12):
        parts.append(sentences.take(pa.array(rng.integers(0, len(sentences), len(ids)))))
    return pc.binary_join_element_wise(*parts, "")


def make_snapshot(path: Path, names: list[str], layout: str = "realistic", seed: int = 2) -> None:
    """8 CPU nodes listing their images in full (nodeStatusMaxImages: -1), laid out as the module says."""
    rng = np.random.default_rng(seed)
    built = rng.random(len(names)) >= 0.03 if layout == "realistic" else None
    nodes = []
    for n in range(NODES):
        if layout == "realistic":
            kept = rng.random(len(names)) >= 0.01
            held = [name for name, here in zip(names, built & kept) if here]
            images = [_listed(f"docker.io/library/{h}", "openai", 10**9) for h in held] + [
                _listed(*system) for system in SYSTEM_IMAGES]
        else:
            held = [name for name, keep in zip(names, rng.random(len(names)) < 0.95) if keep]
            images = [{"names": [f"docker.io/library/{h}:openai"], "sizeBytes": 10**9} for h in held]
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"cpu-{n}", "labels": {
                    "pool": "cpu", "kubernetes.io/hostname": f"cpu-{n}", "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "c6i.8xlarge"}},
                "spec": {"podCIDR": f"10.244.{n}.0/24"},
                "status": {
                    "capacity": {"cpu": "32", "memory": "65536Mi", "pods": "110"},
                    "allocatable": {"cpu": "31", "memory": "63488Mi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    "nodeInfo": {"containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.33.1"},
                    "images": images,
                },
            }
        )
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))


SYSTEM_IMAGES = [("registry.k8s.io/pause", "3.10", 320_368), ("registry.k8s.io/kube-proxy", "v1.33.1", 30_896_183),
                 ("docker.io/calico/node", "v3.29.0", 144_474_437), ("docker.io/calico/cni", "v3.29.0", 94_460_813)]


def _listed(repository: str, tag: str, size: int) -> dict:
    """An image as the kubelet lists it: its repo digest, then its tag."""
    digest = hashlib.sha256(f"{repository}:{tag}".encode()).hexdigest()
    return {"names": [f"{repository}@sha256:{digest}", f"{repository}:{tag}"], "sizeBytes": size}


def time_pyarrow(path: Path, out: Path) -> float:
    start = time.perf_counter()
    pq.write_table(pq.read_table(path), out)
    return time.perf_counter() - start


def installed_env(pycache: Path) -> dict[str, str]:
    """The environment of a process that runs as an installed package does: pip compiles every
    module's bytecode at install, so a process reads it instead of compiling the sources."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def time_pyarrow_process(path: Path, out: Path, env: dict[str, str] | None = None) -> float:
    """The same read + write as a process of its own, timed like the scan (start-up included)."""
    code = f"import pyarrow.parquet as pq; pq.write_table(pq.read_table({str(path)!r}), {str(out)!r})"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


def time_scan(path: Path, snapshot: Path, out_dir: Path, env: dict[str, str] | None = None,
              report: bool = False) -> float:
    """`report`: the scan writes --report and --missing-images too, beside --out-dir."""
    command = [
        sys.executable, "-m", "image_preflight", "scan", str(path), "--template", str(TEMPLATE),
        "--inventory", str(snapshot), "--max-images", "-1", "--out-dir", str(out_dir),
    ]
    if report:
        command += ["--report", str(out_dir.parent / "report.json"),
                    "--missing-images", str(out_dir.parent / "missing.txt")]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def naive_seconds_per_row(path: Path, snapshot: Path, sample: int) -> float:
    """Render + YAML-parse + decide every row on its own, as a per-row loop would."""
    import jinja2
    import yaml

    from image_preflight.core.decide.decision import decide
    from image_preflight.core.decide.workloads import pod_spec_of
    from image_preflight.core.rows.render import yaml_escape
    from image_preflight.files.inventory import load_inventory_file

    inventory = load_inventory_file(snapshot, max_images=-1)
    env = jinja2.Environment()
    env.filters["yaml_escape"] = yaml_escape
    template = env.from_string(TEMPLATE.read_text())
    rows = pq.read_table(path).slice(0, sample).to_pylist()
    start = time.perf_counter()
    for row in rows:
        job = next(iter(yaml.safe_load_all(template.render(input=row, job_name="naive"))))
        decide(pod_spec_of(job), inventory)
    return (time.perf_counter() - start) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--naive-sample", type=int, default=20_000)
    parser.add_argument("--snapshot", choices=("realistic", "independent"), default="realistic")
    parser.add_argument("--report", action="store_true", help="the scan writes --report and --missing-images too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data, snapshot, out_dir = work / "train.parquet", work / "nodes.json", work / "out"
        out_dir.mkdir()
        names = make_dataset(data, args.rows, args.images)
        make_snapshot(snapshot, names, args.snapshot)
        env = installed_env(work / "pycache")
        time_scan(data, snapshot, out_dir, env, args.report)  # compiles the bytecode, as an install does
        arrow, arrow_process, scan = [], [], []
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits all alike
            arrow.append(time_pyarrow(data, work / "copy.parquet"))
            arrow_process.append(time_pyarrow_process(data, work / "copy.parquet", env))
            scan.append(time_scan(data, snapshot, out_dir, env, args.report))
        naive = naive_seconds_per_row(data, snapshot, min(args.naive_sample, args.rows)) * args.rows
        size_mb = data.stat().st_size / 1e6
    a, ap, s = statistics.median(arrow), statistics.median(arrow_process), statistics.median(scan)
    print(f"dataset: {args.rows:,} rows, {args.images:,} images, {size_mb:.0f} MB parquet, {NODES} nodes "
          f"({args.snapshot} snapshot){', with --report and --missing-images' if args.report else ''}")
    print(f"pyarrow read+write      : {a:7.2f} s (median of {args.repeat}, in this process)")
    print(f"pyarrow read+write, proc: {ap:7.2f} s (median of {args.repeat}, a process of its own)")
    print(f"image-preflight scan    : {s:7.2f} s (median of {args.repeat}, whole process)")
    print(f"naive per-row (extrap.) : {naive:7.2f} s (from {min(args.naive_sample, args.rows):,} rows)")
    print(f"scan / pyarrow process  : {s / ap:7.2f}  (target <= 2; both whole processes){_spread(scan, arrow_process)}")
    print(f"scan / pyarrow in-proc  : {s / a:7.2f}  (the scan's start-up counted, pyarrow's not){_spread(scan, arrow)}")
    print(f"naive / scan            : {naive / s:7.1f}  (target >= 20)")


def _spread(scan: list[float], arrow: list[float]) -> str:
    """The range of the ratios of the runs side by side (each scan after its pyarrow runs)."""
    ratios = [s / a for s, a in zip(scan, arrow)]
    return f"; runs {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""


if __name__ == "__main__":
    main()
