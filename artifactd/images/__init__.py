"""Runtime images that carry their compile caches, and the init-container image.

Modules:

* :mod:`~artifactd.images.append`: add an artifact to an image straight in the
  registry, with no container engine: one new layer holding the artifact's OCI
  layout at ``/opt/prebuilt-cache/<fingerprint hash>/``, the base image's layers
  reused where they are.
* :mod:`~artifactd.images.build`: build the same runtime image, or the
  init-container image (artifactd alone, running ``artifactd restore``), with a
  container engine through the Docker Engine API, from the templates in
  ``dockerfiles/``.
* :mod:`~artifactd.images.wheels`: build the wheels the init image installs.
"""
