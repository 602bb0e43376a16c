"""Node agent benchmark: what pinning adds to the agent's cycle, by image count.

    sudo .venv/bin/python benchmarks/agent_pinning.py [--images 1000 10000] [--repeat 20]

Needs root and the containerd 2.x that tests/controlplane/build builds (its folder on PATH), since
containerd 1.6 cannot pin. For each count: a private containerd 2.x on tmpfs holds that many
images, every one of them on the needed list (the most the agent can have to keep pinned), and
the agent publishes to the in-process apiserver of the tests. Reports, in the same run:
- first pass: the cycle that pins them all (one Images/Get and Images/Update per image);
- idle cycle without pinning, and with it once all are pinned (its filtered Images/List of the
  marked records and the plan), alternated run by run, medians of `--repeat`, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image_preflight.agent.containerd_images import ImageRecords
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.pinner import Pinner
from image_preflight.agent.publisher import Publisher
from image_preflight.agent.runner import Agent
from image_preflight.core.image_gc.pinning import NEEDED_CONFIGMAP
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from tests.containerd import Containerd, build_oci_archive_many, containerd2_binary, import_image
from tests.fake_apiserver import FakeApiServer, make_api_client

LEASE = 3600  # no renewal during the runs: an idle cycle writes nothing


def bench(count: int, repeat: int, binary: str) -> dict:
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # containerd syncs every write
    names = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:05d}:openai" for n in range(count)]
    with Containerd(base_dir=base, binary=binary) as runtime, FakeApiServer() as server:
        server.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages")
        archive = os.path.join(runtime.dir, "many.tar")
        build_oci_archive_many(archive, names)
        import_image(runtime.socket, archive, unpack=False)
        api = make_api_client(server)
        with ImageClient(runtime.endpoint, timeout=60) as client, ImageRecords(runtime.endpoint, timeout=60) as records:
            deadline = time.monotonic() + 120
            while len(client.list_images()) < count and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(client.list_images()) == count
            pinner = Pinner(records, NEEDED_CONFIGMAP)
            pinner.set_list({"data": {"needed.txt": "".join(f"{name}\n" for name in names)}})
            plain = Agent(client, Publisher(api, "plain", lease_seconds=LEASE), interval=30, image_events=False)
            pinning = Agent(client, Publisher(api, "pinning", lease_seconds=LEASE), interval=30, image_events=False,
                            pinner=pinner)
            plain.cycle()
            start = time.perf_counter()
            pinning.cycle()
            first_s = time.perf_counter() - start
            assert pinner.pinned == count, f"pinned {pinner.pinned} of {count}"
            deadline = time.monotonic() + 60
            while sum(image.pinned for image in client.list_images()) < count and time.monotonic() < deadline:
                time.sleep(0.1)
            pinning.cycle()  # publishes the pinned flags once
            without, with_pins = [], []
            for _ in range(repeat):
                for agent, durations in ((plain, without), (pinning, with_pins)):
                    start = time.perf_counter()
                    agent.cycle()
                    durations.append(time.perf_counter() - start)
            assert pinner.pinned == count and pinner.unpinned == 0
        api.close()
    plain_ms, pinning_ms = statistics.median(without) * 1000, statistics.median(with_pins) * 1000
    return {"images": count, "first_s": first_s, "plain_ms": plain_ms, "pinning_ms": pinning_ms,
            "ratio": pinning_ms / plain_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    try:
        binary = containerd2_binary()
    except BaseException as exc:  # pytest's skip outcome
        sys.exit(f"agent_pinning: {exc}")
    rows = [bench(count, args.repeat, binary) for count in args.images]
    print(f"node agent cycle with pinning, every image needed; medians of {args.repeat} alternated runs")
    print("| images | first pass (pins all) | idle cycle | idle cycle, pinning | ratio |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['images']:,} | {row['first_s']:.2f} s | {row['plain_ms']:.1f} ms | {row['pinning_ms']:.1f} ms"
              f" | {row['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
