"""The upload route's body limit: the adapter archive's size plus room for the multipart envelope."""

from __future__ import annotations

from loraplex.platform.body_limit import BodySizeLimit

# Room for the multipart envelope and the small form fields around the file.
MULTIPART_OVERHEAD = 64 * 1024


class UploadSizeLimit(BodySizeLimit):
    def __init__(self, app, path: str, max_bytes: int) -> None:
        super().__init__(
            app,
            max_bytes + MULTIPART_OVERHEAD,
            path=path,
            method="POST",
            message=f"the upload is larger than {max_bytes} bytes",
            param="file",
        )
