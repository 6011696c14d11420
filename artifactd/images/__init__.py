"""Runtime images that carry their compile caches, and the init-container image.

:mod:`~artifactd.images.append` adds an artifact to an image straight in the
registry, with no container engine: one new layer holding the artifact's OCI
layout at ``/opt/prebuilt-cache/<fingerprint hash>/``, the base image's layers
reused where they are.

:mod:`~artifactd.images.build` builds the same runtime image, or the
init-container image (artifactd alone, running ``artifactd restore``), with a
container engine through the Docker Engine API, from the templates in
``dockerfiles/``; :mod:`~artifactd.images.wheels` builds the wheels the init
image installs.
"""
