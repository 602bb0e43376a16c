"""containerd's own images API on the runtime's socket: the pinned label on image records.

CRI has no call that pins an image; containerd's CRI plugin reports an image as pinned when one
of its records in the CRI namespace carries the label (image_preflight.core.image_gc.pinning), and its
image event handler takes a label change in within a moment (internal/cri/server/images,
the /images/update event), so ListImages reports it on the next list.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.protobuf import field_mask_pb2

from image_preflight.agent import containerd_images_pb2 as pb
from image_preflight.agent import containerd_images_pb2_grpc
from image_preflight.agent.cri import _CHANNEL_OPTIONS, CRIError, call, socket_path
from image_preflight.agent.events import CRI_NAMESPACE
from image_preflight.core.image_gc.pinning import MARK_LABEL, MARK_VALUE, PINNED_LABEL, PINNED_VALUE

NAMESPACE_HEADER = "containerd-namespace"  # containerd's namespaces.GRPCHeader
GET = "containerd.services.images.v1.Images/Get"
LIST = "containerd.services.images.v1.Images/List"
UPDATE = "containerd.services.images.v1.Images/Update"
# Only the records carrying our mark: a list of every image is not needed to find ours.
MARKED_FILTER = f'labels."{MARK_LABEL}"=="{MARK_VALUE}"'
_MASK = (f"labels.{PINNED_LABEL}", f"labels.{MARK_LABEL}")


class ImageRecords:
    """Reads and labels image records in the CRI namespace over one channel."""

    def __init__(self, endpoint: str, *, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.insecure_channel("unix://" + socket_path(endpoint), options=_CHANNEL_OPTIONS)
        self._images = containerd_images_pb2_grpc.ImagesStub(self._channel)
        self._metadata = ((NAMESPACE_HEADER, CRI_NAMESPACE),)

    def marked(self) -> dict[str, dict[str, str]]:
        """The records this agent pinned, by name, with their labels."""
        response = call(self.endpoint, LIST, self._images.List, pb.ListImagesRequest(filters=[MARKED_FILTER]),
                        timeout=self.timeout, metadata=self._metadata)
        return {image.name: dict(image.labels) for image in response.images}

    def pin(self, name: str) -> bool:
        """Label the record pinned and ours; False when there is no such record (any more)."""
        image = self._get(name)
        return image is not None and self._update(image, {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE})

    def unpin(self, name: str) -> bool:
        """Remove both labels (a label the mask names and the image lacks is deleted); False when
        the record does not carry our mark (any more), so a pin of anyone else's stays."""
        image = self._get(name)
        return image is not None and image.labels.get(MARK_LABEL) == MARK_VALUE and self._update(image, {})

    def _get(self, name: str) -> pb.Image | None:
        try:
            return call(self.endpoint, GET, self._images.Get, pb.GetImageRequest(name=name),
                        timeout=self.timeout, metadata=self._metadata).image
        except CRIError as exc:
            if exc.not_found:
                return None
            raise

    def _update(self, image: pb.Image, labels: Mapping[str, str]) -> bool:
        # The target goes along although the mask leaves it: containerd 2.4 crashes on an Update
        # without one (plugins/services/images/helpers.go, imageFromProto).
        request = pb.UpdateImageRequest(image=pb.Image(name=image.name, labels=dict(labels), target=image.target),
                                        update_mask=field_mask_pb2.FieldMask(paths=list(_MASK)))
        try:
            call(self.endpoint, UPDATE, self._images.Update, request, timeout=self.timeout, metadata=self._metadata)
        except CRIError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ImageRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
