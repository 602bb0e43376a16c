"""Candidate published forms for the node agents' image lists at fleet scale, measured offline.

    .venv/bin/python benchmarks/published_forms.py   # --nodes 5000 --images 5000 --catalogue 7500
                          # [--names swebench --sample 100 --id-bits 40 --seed 1 --json FILE]

No cluster. The fleet is benchmarks/fleet.py's (locally built `<name>:openai` images, one tag, no
repo digest), each image with an ID of its own on each node: local builds are not reproducible.
--sample nodes are built in full in every form from the agent's image dicts; per-node figures are
their mean, fleet figures that mean x --nodes plus shared objects counted once. An object is sized
as etcd stores a custom object: compact JSON, metadata with uid, creationTimestamp, generation and
the managedFields entry a create leaves (built here in FieldsV1's shape, where an atomic list or a
string is one entry; not read from a cluster).

--names: swebench, fleet.py's (docker.io/swebench/sweb.eval.x86_64.<owner>_1776_<repo>-<n>, with
n < 40,000: regular enough to flatter zlib); swesmith, SWE-smith's
(docker.io/jyangballin/swesmith.x86_64.<owner>__<repo>.<8 hex>, 151 repositories, each name a
commit of its own); random, the worst case (one of 4 registry paths + 20 random [a-z0-9]). Which
node holds which image is the same under each.

Forms. A today's NodeImages, renewed by rewriting it. B A's list written on change only, renewed
through a coordination.k8s.io/v1 Lease per node (KEP-589); all below renew so too. C image_key()
strings and IDs (C-: no IDs). D C as one zlib + base64 string; DF- D-'s names front-coded (each as
the length it shares with the one before + the rest) before zlib. E truncated hashes (64, 48 or 40
bits) of names and IDs, sorted, Golomb-Rice coded in two streams (unary quotients, fixed remainders:
numpy decodes them) + base64. F a shared name table (--shards append-only objects, by hash of the
name) + a zlib'd bitmap per node, IDs as E's in --id-bits. H D-'s names + IDs as E's. "-": no IDs;
"/b": IDs in b bits. Content-addressed chunks of names (an object per distinct bucket of a node's
names) are not among them: the nodes' sets differ, so almost no chunk is shared (1.9 GiB for a
fleet of 5,000 x 5,000).

Table 1: object, one node's object (KiB); fleet, all objects (MiB); add, bytes written when a node
adds an image other nodes hold; renew, an idle renewal (A: the object; else the Lease as JSON, a
little smaller as etcd's protobuf); idle, all renewals (one per node every 200 s, as today); chg/s,
list changes per second the fleet can write within 1 MiB/s beside them; enc, CPU to build one node's
object bytes (median); dec, CPU to decode every node into the reader's structure (the sample's,
scaled); reader, that structure for every node: for A and B today's (node_images_from_runtime +
image_set.compact, by tracemalloc, scaled), else names interned in one table, a node's as a sorted
uint32 array, its IDs as a sorted uint64 array of hashes. fails: S etcd > 200 MiB, W idle writes
> 1 MiB/s, R a renewal over 10 % of the object (and 1 KiB), O an object >= 1.5 MiB, T decode
> 60 s, M reader > 512 MiB.
Table 2: the chance that a name or ID no node holds reads as held on some node; shared objects; F's
cold start simulated (every agent at once, optimistic concurrency: per round one write per shard
wins, every other agent still missing names there gets a 409, reads the shard again and retries).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
import zlib
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.fleet import catalogue, draw_sets, holding_probabilities, sharing
from image_preflight.agent.cri import RuntimeImage
from image_preflight.agent.inventory import image_dicts, node_images_object
from image_preflight.core.decide.inventory import image_key
from image_preflight.core.sources.image_hashes import decode, hashes_of, pack
from image_preflight.core.sources.runtime_lists import RENEW_WHEN_REMAINING, node_images_from_runtime
from image_preflight.image_set import compact

GROUP_VERSION = "image-preflight.io/v1alpha1"
LEASE_S = 300
RENEW_EVERY_S = LEASE_S * (1 - RENEW_WHEN_REMAINING)
NOW = "2026-11-29T19:00:00Z"
SANDBOX = {"name": "registry.k8s.io/pause:3.10.1", "present": True}
MANAGER = "OpenAPI-Generator"  # the field manager the kubernetes Python client's User-Agent gives
ETCD_REQUEST_LIMIT = int(1.5 * 2**20)
BOUNDS = {"total": 200 * 2**20, "writes": 2**20, "renew_share": 0.10, "decode_s": 60.0, "reader": 512 * 2**20}
# Python repositories of the kind SWE-smith builds images for, lower case as image names are.
SWESMITH_REPOS = """
pandas-dev/pandas python-pillow/pillow tornadoweb/tornado pycqa/flake8 encode/starlette encode/httpx
encode/uvicorn tiangolo/fastapi pallets/click pallets/jinja pallets/markupsafe pallets/werkzeug
pallets/flask psf/black psf/requests sqlalchemy/sqlalchemy python-attrs/attrs python-attrs/cattrs
marshmallow-code/marshmallow marshmallow-code/webargs pyparsing/pyparsing pygments/pygments
sphinx-doc/sphinx getmoto/moto boto/boto3 boto/botocore aio-libs/aiohttp aio-libs/yarl celery/celery
celery/kombu benoitc/gunicorn django/django django/channels encode/django-rest-framework
python-poetry/poetry pypa/pip pypa/setuptools pypa/packaging pypa/virtualenv pypa/pipenv pypa/hatch
tox-dev/tox pytest-dev/pytest pytest-dev/pluggy pytest-dev/pytest-xdist hypothesisworks/hypothesis
numpy/numpy scipy/scipy scikit-learn/scikit-learn scikit-image/scikit-image matplotlib/matplotlib
mwaskom/seaborn plotly/plotly.py bokeh/bokeh holoviz/panel pydata/xarray dask/dask dask/distributed
modin-project/modin pola-rs/polars apache/arrow sympy/sympy networkx/networkx astropy/astropy
sunpy/sunpy pydantic/pydantic python/mypy pylint-dev/pylint pylint-dev/astroid pycqa/isort
pycqa/pyflakes pycqa/pycodestyle pycqa/bandit pycqa/pydocstyle google/yapf hhatto/autopep8
asottile/pyupgrade iterative/dvc conan-io/conan facebookresearch/hydra omry/omegaconf
project-monai/monai huggingface/transformers huggingface/datasets pytorch/vision keras-team/keras
lightning-ai/pytorch-lightning mlflow/mlflow optuna/optuna spotify/luigi apache/airflow
prefecthq/prefect dagster-io/dagster scrapy/scrapy scrapy/parsel lxml/lxml mozilla/bleach
html5lib/html5lib-python python-markdown/markdown lepture/mistune yaml/pyyaml tkem/cachetools
jd/tenacity pexpect/pexpect paramiko/paramiko fabric/fabric pyca/cryptography jpadilla/pyjwt
python-jsonschema/jsonschema python-openxml/python-docx sdispater/pendulum arrow-py/arrow
dateutil/dateutil stub42/pytz agronholm/apscheduler agronholm/anyio python-trio/trio gevent/gevent
redis/redis-py mongodb/mongo-python-driver psycopg/psycopg pymysql/pymysql tortoise/tortoise-orm
coleifer/peewee sqlalchemy/alembic msiemens/tinydb mahmoud/boltons mahmoud/glom pytoolz/toolz
more-itertools/more-itertools cool-rr/pysnooper gruns/icecream textualize/rich textualize/textual
tqdm/tqdm joke2k/faker spulec/freezegun pyca/pyopenssl urllib3/urllib3 certifi/python-certifi
chardet/chardet jawah/charset_normalizer kjd/idna mitmproxy/mitmproxy httpie/cli locustio/locust
jmespath/jmespath.py pyeve/cerberus keleshev/schema alecthomas/voluptuous cloudpipe/cloudpickle
""".split()
RANDOM_PLACES = ["registry.example.com/ci/builds", "123456789012.dkr.ecr.us-east-1.amazonaws.com/rl/envs",
                 "europe-docker.pkg.dev/acme-ml/rollouts", "ghcr.io/acme/agent-sandboxes"]


# --- objects as etcd stores them -------------------------------------------------------------------

def fields_v1(value) -> dict:
    """FieldsV1 of a create: a map's keys as f:<key>, nested; lists (atomic) and scalars as {}."""
    if not isinstance(value, dict):
        return {}
    return {".": {}, **{f"f:{key}": fields_v1(item) for key, item in sorted(value.items())}}


def stored(kind: str, name: str, spec: dict, api_version: str = GROUP_VERSION, namespace: str = "") -> bytes:
    uid = hashlib.sha256(name.encode()).hexdigest()
    metadata = {"creationTimestamp": NOW, "generation": 1, "managedFields": [{
        "apiVersion": api_version, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": fields_v1(spec)},
        "manager": MANAGER, "operation": "Update", "time": NOW}], "name": name,
        **({"namespace": namespace} if namespace else {}),
        "uid": f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:32]}"}
    return json.dumps({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec},
                      separators=(",", ":")).encode()


def lease_bytes(node: str) -> int:
    spec = {"holderIdentity": node, "leaseDurationSeconds": LEASE_S, "renewTime": "2026-11-29T19:00:00.000000Z"}
    return len(stored("Lease", node, spec, "coordination.k8s.io/v1", "image-preflight"))


# --- the forms ---------------------------------------------------------------------------------------

def intern(table: dict, keys) -> np.ndarray:
    """The reader's columns for `keys` in its process-wide `table` (name or name hash -> column)."""
    return np.sort(np.array([table.setdefault(key, len(table)) for key in keys], dtype=np.uint32))


def node_keys(images: list[dict]) -> tuple[list[str], list[str]]:
    keys = {image_key(name) for image in images for name in (*image["repoTags"], *image["repoDigests"])}
    return sorted(keys), sorted(image["id"] for image in images)


def shard(key: str, shards: int) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % shards


class Form:
    """A node's image dicts to its stored object, and back to the reader's (names as table columns,
    IDs as hashes). id_bits: None no IDs, 0 IDs in full, else Rice-coded hashes of so many bits."""

    renew_in_object = False
    bits: int | None = None  # the names' hash bits, where hashed
    shared: list[bytes] = []  # objects shared by the fleet (counted once)

    def __init__(self, name: str, id_bits: int | None) -> None:
        self.name, self.id_bits = name, id_bits

    def encode(self, node: str, images: list[dict]) -> bytes:
        keys, ids = node_keys(images)
        spec = {"nodeName": node, "observedAt": NOW, "leaseDurationSeconds": LEASE_S, "imageCount": len(images),
                "sandboxImage": SANDBOX, **self.names_fields(keys, ids)}
        if self.id_bits:
            spec |= {"idHashBits": self.id_bits, "ids": pack(hashes_of(ids, self.id_bits), self.id_bits)}
        return stored("NodeImages", node, spec)

    def decode(self, raw: bytes, table: dict) -> tuple[np.ndarray, np.ndarray]:
        spec = json.loads(raw)["spec"]
        refs, ids = self.names_of(spec, table)
        return refs, decode(spec["ids"], bits=self.id_bits) if self.id_bits else hashes_of(ids, 64)


class Today(Form):
    def __init__(self, name: str, renew_in_object: bool) -> None:
        super().__init__(name, 0)
        self.renew_in_object = renew_in_object

    def encode(self, node, images):
        obj = node_images_object(node, images, observed_at=1_795_633_200, lease_seconds=LEASE_S,
                                 spec={"sandboxImage": SANDBOX})
        return stored("NodeImages", node, obj["spec"])

    def decode(self, raw, table):  # today's reader, into its own structure (today_reader sizes it)
        return compact(node_images_from_runtime(json.loads(raw)))


def front_code(keys: list[str]) -> bytes:
    """Sorted ASCII names as their count, the length each shares with the one before (a byte
    each), then the rest of each, one a line: a byte for the head a name repeats, where zlib
    spends a match (a length and a distance) on it."""
    shared = [0] + [min(255, len(os.path.commonprefix((a, b)))) for a, b in zip(keys, keys[1:])]
    return (len(keys).to_bytes(4, "big") + bytes(shared)
            + "\n".join(key[n:] for key, n in zip(keys, shared)).encode())


def front_decode(raw: bytes) -> list[str]:
    count, names, name = int.from_bytes(raw[:4], "big"), [], ""
    for shared, rest in zip(raw[4:4 + count], raw[4 + count:].decode().split("\n")):
        name = name[:shared] + rest
        names.append(name)
    return names


class Names(Form):
    """C: image_key() strings; zlib'd (D, H): the names, and IDs in full, as one string; front:
    the names front-coded, then zlib'd (IDs only hashed)."""

    def __init__(self, name: str, id_bits: int | None, packed: bool = False, front: bool = False) -> None:
        super().__init__(name, id_bits)
        self.packed, self.front = packed or front, front

    def names_fields(self, keys, ids):
        if not self.packed:
            return {"names": keys, **({"ids": ids} if self.id_bits == 0 else {})}
        if self.front:  # IDs, if any, as hashes (Form.encode)
            raw = front_code(keys)
        else:
            raw = ("\n".join(keys) + ("\n\n" + "\n".join(ids) if self.id_bits == 0 else "")).encode()
        return {"encoding": "front+zlib" if self.front else "zlib",
                "list": base64.b64encode(zlib.compress(raw, 9)).decode()}

    def names_of(self, spec, table):
        if not self.packed:
            return intern(table, spec["names"]), spec.get("ids", [])
        raw = zlib.decompress(base64.b64decode(spec["list"]))
        if self.front:
            return intern(table, front_decode(raw)), []
        names, _, ids = raw.decode().partition("\n\n")
        return intern(table, names.split("\n")), ids.split("\n") if ids else []


class Hashed(Form):
    """E: truncated hashes of the names, Rice-coded."""

    def __init__(self, name: str, bits: int, id_bits: int | None) -> None:
        super().__init__(name, id_bits)
        self.bits = bits

    def names_fields(self, keys, ids):
        return {"hashBits": self.bits, "names": pack(hashes_of(keys, self.bits), self.bits)}

    def names_of(self, spec, table):
        return intern(table, decode(spec["names"], bits=self.bits).tolist()), []


class Shared(Form):
    """F: the fleet's names in `shards` append-only objects; a node's set as one bitmap per
    shard over the positions it saw, zlib'd."""

    def __init__(self, name: str, names: list[str], held: np.ndarray, shards: int, id_bits: int | None) -> None:
        super().__init__(name, id_bits)
        self.table: list[list[str]] = [[] for _ in range(shards)]
        for key in (key for key, holders in zip(names, held) if holders):
            self.table[shard(key, shards)].append(key)
        self.position = {key: (s, i) for s, keys in enumerate(self.table) for i, key in enumerate(keys)}
        self.shared = [stored("NodeImageNames", f"names-{s:02x}", {"names": keys}) for s, keys in enumerate(self.table)]
        self.columns: list[np.ndarray] = []

    def names_fields(self, keys, ids):
        bitmaps = [np.zeros(len(keys_), dtype=np.uint8) for keys_ in self.table]
        for key in keys:
            s, index = self.position[key]
            bitmaps[s][index] = 1
        packed = zlib.compress(b"".join(np.packbits(bitmap).tobytes() for bitmap in bitmaps), 9)
        return {"nameShards": [len(keys_) for keys_ in self.table], "members": base64.b64encode(packed).decode()}

    def decode_shared(self, table: dict) -> None:
        self.columns = [intern(table, json.loads(raw)["spec"]["names"]) for raw in self.shared]

    def names_of(self, spec, table):
        bits = np.unpackbits(np.frombuffer(zlib.decompress(base64.b64decode(spec["members"])), np.uint8))
        refs, start = [], 0
        for columns, length in zip(self.columns, spec["nameShards"]):
            refs.append(columns[np.flatnonzero(bits[start:start + length])])
            start += (length + 7) // 8 * 8
        return np.sort(np.concatenate(refs)), []


# --- the fleet ---------------------------------------------------------------------------------------

def node_images(images: list[RuntimeImage], chosen: np.ndarray, node: str) -> list[dict]:
    """A node's image dicts as the agent publishes them; each image ID of its own on this node."""
    return image_dicts(RuntimeImage(id="sha256:" + hashlib.sha256(f"{node}/{images[i].id}".encode()).hexdigest(),
                                    repo_tags=images[i].repo_tags, repo_digests=images[i].repo_digests,
                                    size=images[i].size, pinned=False) for i in chosen)


def renamed(images: list[RuntimeImage], model: str, rng: np.random.Generator) -> list[RuntimeImage]:
    """The catalogue under another name model (--names): each image a name of its own."""
    if model == "swebench":
        return images
    characters = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    names: dict[str, None] = {}  # insertion-ordered, so that a seed gives the same fleet
    while len(names) < len(images):
        if model == "swesmith":
            owner, repo = SWESMITH_REPOS[int(rng.integers(len(SWESMITH_REPOS)))].split("/")
            names[f"docker.io/jyangballin/swesmith.x86_64.{owner}__{repo}.{int(rng.integers(2**32)):08x}"] = None
        else:
            place = RANDOM_PLACES[int(rng.integers(len(RANDOM_PLACES)))]
            names[f"{place}/{''.join(rng.choice(characters, 20))}"] = None
    return [replace(image, repo_tags=(f"{name}:openai",)) for image, name in zip(images, names)]


def cold_start(form: Shared, names: list[str], sets: list[np.ndarray], rng: np.random.Generator) -> dict:
    """Every agent at once adds the names it holds to the shared table (see the module's doc)."""
    held = np.zeros((len(sets), len(names)), dtype=bool)
    for row, chosen in enumerate(sets):
        held[row, chosen] = True
    shard_of = np.array([shard(name, len(form.table)) for name in names])
    rounds, conflicts = [], 0
    for index in range(len(form.table)):
        mine = held[:, shard_of == index]
        present = np.zeros(mine.shape[1], dtype=bool)
        rounds.append(0)
        while (waiting := np.flatnonzero((mine & ~present).any(axis=1))).size:
            present |= mine[rng.choice(waiting)]
            rounds[-1] += 1
            conflicts += waiting.size - 1
    return {"serial_writes_max": max(rounds), "conflicts": conflicts,
            "reread_bytes": conflicts * statistics.mean(len(raw) for raw in form.shared)}


# --- measuring -------------------------------------------------------------------------------------

def reader_bytes(parts: list[tuple[np.ndarray, np.ndarray]], table: dict, nodes: int, distinct: int) -> float:
    """The reader's structure for `nodes` nodes from the sample's: the arrays (and a NodeImages
    each), and the table at `distinct` keys."""
    per_node = statistics.mean(refs.nbytes + ids.nbytes + 2 * 112 + 200 for refs, ids in parts)
    per_key = (sys.getsizeof(table) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in table.items())) / len(table)
    return nodes * per_node + distinct * per_key


def today_reader(raws: list[bytes], nodes: int) -> float:
    """Today's reader (compacted NodeImages, process-wide ImageSet table), traced, scaled to `nodes`."""
    from image_preflight import image_set
    image_set._ids.clear(), image_set._names.clear()  # measured from an empty table
    tracemalloc.start()
    kept = [compact(node_images_from_runtime(json.loads(raws[0])))]
    first = tracemalloc.get_traced_memory()[0]
    kept += [compact(node_images_from_runtime(json.loads(raw))) for raw in raws[1:]]
    last = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    image_set._ids.clear(), image_set._names.clear()
    return first + (last - first) / (len(kept) - 1) * (nodes - 1)


def measure(form: Form, sample: list[tuple[str, list[dict]]], nodes: int, distinct: int, lease: int) -> dict:
    raws, encode_s = [], []
    for node, images in sample:
        start = time.process_time()
        raws.append(form.encode(node, images))
        encode_s.append(time.process_time() - start)
    table: dict = {}
    start = time.process_time()
    if isinstance(form, Shared):
        form.decode_shared(table)
    shared_s = time.process_time() - start
    parts = [form.decode(raw, table) for raw in raws]
    decode_s = shared_s + (time.process_time() - start - shared_s) * nodes / len(raws)
    size = statistics.mean(len(raw) for raw in raws)
    return {"object": size, "object_max": max(len(raw) for raw in raws), "add": size,
            "renew": size if form.renew_in_object else lease, "encode_ms": statistics.median(encode_s) * 1e3,
            "decode_s": decode_s, "shared": sum(len(raw) for raw in form.shared), "shared_objects": len(form.shared),
            "shared_max": max((len(raw) for raw in form.shared), default=0),
            "reader": today_reader(raws, nodes) if isinstance(form, Today)
            else reader_bytes(parts, table, nodes, distinct)}


def false_positive(nodes: int, keys: int, bits: int | None) -> float:
    """The chance that some node's `keys` hashes of `bits` bits hold a key absent from them all."""
    return 0.0 if not bits else -math.expm1(nodes * math.log1p(-keys / 2.0 ** bits))


def judge(f: dict, nodes: int) -> dict:
    f["total"] = f["object"] * nodes + f["shared"]
    f["writes"] = nodes * f["renew"] / RENEW_EVERY_S
    f["changes_per_s"] = max(0.0, BOUNDS["writes"] - f["writes"]) / f["add"]
    f["fails"] = "".join(letter for letter, failed in (
        ("S", f["total"] > BOUNDS["total"]), ("W", f["writes"] > BOUNDS["writes"]),
        ("R", f["renew"] > max(BOUNDS["renew_share"] * f["object"], 1024)),
        ("O", max(f["object_max"], f["shared_max"]) >= ETCD_REQUEST_LIMIT),
        ("T", f["decode_s"] > BOUNDS["decode_s"]), ("M", f["reader"] > BOUNDS["reader"])) if failed) or "ok"
    return f


def run(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    images = renamed(catalogue(args.catalogue, digests=False, rng=rng), args.names,
                     np.random.default_rng([args.seed, 1]))  # its own stream: each model, the same sets
    sets = draw_sets(args.nodes, args.images, holding_probabilities(args.catalogue, args.images, args.zipf), rng)
    share = sharing(sets, args.catalogue)
    names = [image_key(image.repo_tags[0]) for image in images]
    held = np.zeros(args.catalogue, dtype=bool)
    held[np.concatenate(sets)] = True
    picked = np.linspace(0, args.nodes - 1, min(args.sample, args.nodes)).astype(int)
    sample = [(f"fleet-{k:05d}", node_images(images, sets[k], f"fleet-{k:05d}")) for k in picked]
    lease = lease_bytes(sample[0][0])
    b = args.id_bits
    forms = [Today("A", True), Today("B", False), Names("C", 0), Names("C-", None), Names("D", 0, True),
             Names("D-", None, True), Names("DF-", None, front=True), Hashed("E64", 64, 64),
             Hashed("E48", 48, 48), Hashed("E48-", 48, None), Hashed("E40-", 40, None),
             Shared(f"F/{b}", names, held, args.shards, b), Shared("F-", names, held, args.shards, None),
             Names(f"H/{b}", b, True), Names("H/32", 32, True)]
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "sharing": share,
              "lease_bytes": lease, "forms": {}}
    for form in forms:
        started = time.monotonic()
        if form.name == "B":  # A's list: only the renewal differs
            f = {**result["forms"]["A"], "renew": lease}
        else:
            f = measure(form, sample, args.nodes, share["distinct_images"], lease)
        if isinstance(form, Shared):
            f |= {"add_new_name": f["object"] + f["shared"] / f["shared_objects"],
                  "cold_start": cold_start(form, names, sets, rng)}
        f |= {"fp_names": false_positive(args.nodes, args.images, form.bits),
              "fp_ids": None if form.id_bits is None else false_positive(args.nodes, args.images, form.id_bits)}
        result["forms"][form.name] = judge(f, args.nodes)
        print(f"  {form.name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return result


# --- output ----------------------------------------------------------------------------------------

def report(result: dict) -> str:
    a, share = result["args"], result["sharing"]
    lines = [f"{a['nodes']:,} nodes x {a['images']:,} images, {a['names']} names (catalogue {a['catalogue']:,}, "
             f"zipf {a['zipf']}, seed {a['seed']}, sample {a['sample']}):",
             f"{share['distinct_images']:,} distinct, {share['images_on_every_node']:,} on every node, "
             f"{share['pairs_on_90pct_or_more']:.0%} of (node, image) pairs on >= 90 % of nodes; "
             f"a Lease {result['lease_bytes']} B.", "",
             f"{'form':<9}{'object':>10}{'fleet':>10}{'add':>10}{'renew':>10}{'idle':>10}{'chg/s':>8}"
             f"{'enc':>8}{'dec':>8}{'reader':>10}  fails",
             f"{'':<9}{'KiB':>10}{'MiB':>10}{'KiB':>10}{'KiB':>10}{'KiB/s':>10}{'':>8}{'ms':>8}{'s':>8}{'MiB':>10}"]
    for name, f in result["forms"].items():
        lines.append(f"{name:<9}{f['object'] / 1024:>10,.1f}{f['total'] / 2**20:>10,.1f}{f['add'] / 1024:>10,.1f}"
                     f"{f['renew'] / 1024:>10,.1f}{f['writes'] / 1024:>10,.1f}{f['changes_per_s']:>8,.1f}"
                     f"{f['encode_ms']:>8,.1f}{f['decode_s']:>8,.1f}{f['reader'] / 2**20:>10,.0f}  {f['fails']}")
    lines += ["", f"{'form':<9}{'FP names':>10}{'FP IDs':>10}{'shared objects':>26}"]
    notes = []
    for name, f in result["forms"].items():
        ids = "no IDs" if f["fp_ids"] is None else f"{f['fp_ids']:.1g}"
        objects = f"{f['shared_objects']:,} = {f['shared'] / 2**20:,.1f} MiB" if f["shared"] else "-"
        lines.append(f"{name:<9}{f['fp_names']:>10.1g}{ids:>10}{objects:>26}")
        if "cold_start" in f:
            c = f["cold_start"]
            notes.append(f"{name}: cold start {c['conflicts']:,} 409s "
                         f"({c['reread_bytes'] / 2**30:,.1f} GiB read again), "
                         f"{c['serial_writes_max']} serial writes/shard; "
                         f"a new name +{f['add_new_name'] / 1024:,.0f} KiB")
    return "\n".join(lines + [""] + notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--images", type=int, default=5000, help="images per node")
    parser.add_argument("--catalogue", type=int, default=7500, help="distinct images the fleet draws from")
    parser.add_argument("--names", choices=("swebench", "swesmith", "random"), default="swebench",
                        help="the images' names (see the module's doc)")
    parser.add_argument("--zipf", type=float, default=2.0, help="the popularity curve's exponent (fleet.py's)")
    parser.add_argument("--sample", type=int, default=100, help="nodes built and decoded in full")
    parser.add_argument("--shards", type=int, default=16, help="F: objects of the shared name table")
    parser.add_argument("--id-bits", type=int, default=40, help="F, H: bits of an image ID's hash")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if not (1 <= args.images <= args.catalogue and 2 <= args.sample and 1 <= args.nodes):
        parser.error("--images 1..--catalogue, --sample >= 2")
    result = run(args)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
