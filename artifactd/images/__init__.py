"""Runtime images that carry their compile caches.

:mod:`~artifactd.images.append` adds an artifact to an image straight in the
registry, with no container engine: one new layer holding the artifact's OCI
layout at ``/opt/prebuilt-cache/<fingerprint hash>/``, the base image's layers
reused where they are.
"""
