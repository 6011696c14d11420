"""The artifact format: OCI config, manifests, layers, archives, unpacking.

Modules:

* :mod:`~artifactd.format.config`: :class:`ArtifactConfig`, the OCI config an artifact
  carries (fingerprint, layers, file lists, provenance).
* :mod:`~artifactd.format.oci`: OCI media types, descriptors and image manifests.
* :mod:`~artifactd.format.imagemanifest`: runtime-image manifests and configs.
* :mod:`~artifactd.format.archive`: write a family's tree into a reproducible tar+zstd layer.
* :mod:`~artifactd.format.unpack`: check and unpack a layer safely; stage a tree.

Nothing is imported here.
"""
