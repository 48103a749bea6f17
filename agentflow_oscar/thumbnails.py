"""A thumbnailer without an image library: the storefront's products have no pictures to resize."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class _Thumbnail:
    url: str


class OriginalImage:
    """Oscar's thumbnailer interface (``OSCAR_THUMBNAILER``) answered with the original image's URL."""

    def generate_thumbnail(self, source: Any, **opts: Any) -> _Thumbnail:
        """The source image itself (Oscar's templates ask for a thumbnail of the placeholder image)."""
        name = getattr(source, "name", str(source))
        return _Thumbnail(url=f"{settings.MEDIA_URL}{name}")

    def delete_thumbnails(self, source: Any) -> None:
        """Nothing was generated, nothing to delete."""
