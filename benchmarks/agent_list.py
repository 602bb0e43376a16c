"""Node agent benchmark: one cycle's cost (CRI ListImages, the diff, the publish) by image count.

    sudo .venv/bin/python benchmarks/agent_list.py [--images 1000 10000] [--repeat 20]

Needs root, containerd and ctr (as the CRI tests do). For each count: a private containerd on
tmpfs gets that many images in one bulk import, the agent lists them over CRI, and publishes to
the in-process apiserver of the tests through the real kubernetes client. Reports medians of
`--repeat` runs:
- list: ImageService/ListImages over an open channel;
- diff: RuntimeImage list -> sorted image dicts -> fingerprint, compared with the stored object;
- idle cycle: list + diff with nothing to write (every `--interval` on a quiet node);
- publish: one replace of the object after a tag changed (create for the first);
- read: the webhook's conversion of the object (node_images_from_runtime), once per watch event;
- object: the JSON size of the NodeImages object (etcd's default request limit is 1.5 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import fingerprint, image_dicts, node_images_object
from image_preflight.agent.publisher import Publisher
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION, node_images_from_runtime
from tests.containerd import Containerd, build_oci_archive_many, import_image, require_containerd
from tests.fake_apiserver import FakeApiServer, make_api_client

NODE = "cpu-bench-1"
LEASE = 300


def median_ms(action: Callable[[], object], repeat: int) -> float:
    durations = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations) * 1000


def bench(count: int, repeat: int) -> dict:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # containerd syncs every write
    names = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:05d}:openai" for n in range(count)]
    with Containerd(base_dir=base) as runtime, FakeApiServer() as server:
        server.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages")
        archive = os.path.join(runtime.dir, "many.tar")
        start = time.perf_counter()
        build_oci_archive_many(archive, names)
        import_image(runtime.socket, archive, unpack=False)
        imported_s = time.perf_counter() - start
        api = make_api_client(server)
        with ImageClient(runtime.endpoint, timeout=60) as client:
            deadline = time.monotonic() + 120
            while len(client.list_images()) < count and time.monotonic() < deadline:
                time.sleep(0.2)
            listed = client.list_images()
            assert len(listed) == count, f"CRI lists {len(listed)} of {count} images"

            list_ms = median_ms(client.list_images, repeat)
            diff_ms = median_ms(lambda: fingerprint(image_dicts(listed)), repeat)
            publisher = Publisher(api, NODE, lease_seconds=LEASE)
            now = time.time()
            start = time.perf_counter()
            publisher.publish(image_dicts(listed), now=now)
            create_ms = (time.perf_counter() - start) * 1000

            def idle_cycle() -> None:
                assert publisher.publish(image_dicts(client.list_images()), now=now) is None

            idle_ms = median_ms(idle_cycle, repeat)
            flip = [0]

            def changed_publish() -> None:
                images = image_dicts(listed)
                flip[0] += 1
                images[0]["repoTags"] = images[0]["repoTags"] + [f"docker.io/library/flip:{flip[0]}"]
                assert publisher.publish(images, now=now) is not None

            publish_ms = median_ms(changed_publish, repeat)
        stored = server.get_object(PLURAL, NODE, group=GROUP, version=VERSION)
        read_ms = median_ms(lambda: node_images_from_runtime(stored), repeat)
        size = len(json.dumps(node_images_object(NODE, image_dicts(listed), observed_at=now, lease_seconds=LEASE),
                              separators=(",", ":")))
        api.close()
    return {
        "images": count, "import_s": imported_s, "list_ms": list_ms, "diff_ms": diff_ms, "idle_ms": idle_ms,
        "create_ms": create_ms, "publish_ms": publish_ms, "read_ms": read_ms, "object_bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    try:
        require_containerd()
    except BaseException as exc:  # pytest's skip outcome
        sys.exit(f"agent_list: {exc}")
    rows = [bench(count, args.repeat) for count in args.images]
    print(f"node agent cycle, medians of {args.repeat} runs (containerd {os.uname().machine}, "
          f"in-process apiserver over loopback HTTP)")
    header = ("images", "list", "diff", "idle cycle", "create", "publish", "webhook read", "object")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print(
            f"| {row['images']:,} | {row['list_ms']:.1f} ms | {row['diff_ms']:.1f} ms | {row['idle_ms']:.1f} ms"
            f" | {row['create_ms']:.0f} ms | {row['publish_ms']:.0f} ms | {row['read_ms']:.1f} ms"
            f" | {row['object_bytes'] / 1024:,.0f} KiB |"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    imports = ", ".join(f"{row['images']:,} in {row['import_s']:.1f} s" for row in rows)
    print(f"bulk import (ctr, tmpfs): {imports}; peak RSS of this process {peak:.0f} MiB")


if __name__ == "__main__":
    main()
