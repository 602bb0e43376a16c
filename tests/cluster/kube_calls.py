"""Calls on the test control plane that several cluster tests make: a namespace to admit in, a
refusal's Status, a Job created as agent-lightning's controller creates it."""

from __future__ import annotations

import asyncio
import json
import uuid

import kr8s.asyncio
from kubernetes.client.rest import ApiException


def new_namespace(plane, labels: dict | None = None) -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    plane.core().create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    return name


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


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
