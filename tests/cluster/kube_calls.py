"""A Job created on the test control plane as agent-lightning's controller creates it."""

from __future__ import annotations

import asyncio

import kr8s.asyncio


def kr8s_create(plane, namespace: str, manifest: dict) -> dict | str:
    """Create a Job as agent-lightning's controller does (kr8s, async); the stored Job, or the
    text of the exception (the controller catches Exception and reads str(exc))."""
    async def create() -> dict | str:
        api = await kr8s.asyncio.api(kubeconfig=str(plane.kubeconfig))
        job = await kr8s.asyncio.objects.Job({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}},
                                             api=api)
        try:
            await job.async_create()
        except Exception as exc:
            return str(exc)
        return job.raw

    return asyncio.run(create())
