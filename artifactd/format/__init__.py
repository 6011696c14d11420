"""The artifact format: OCI config, manifests, layers, archives, unpacking.

Modules:

* :mod:`~artifactd.format.config`: :class:`ArtifactConfig`, the OCI config an artifact
  carries (fingerprint, layers, file lists, provenance).
* :mod:`~artifactd.format.canary`: the canary document (greedy ids and a digest of the
  rounded top-k logprobs of a few prompts) a config carries, and the matrix's ``serve.canary``.
* :mod:`~artifactd.format.oci`: OCI media types, annotations and the tag scheme
  (no pydantic: the no-op restore path imports it).
* :mod:`~artifactd.format.imagemanifest`: the OCI image manifest and descriptor models
  (an artifact's and a runtime image's).
* :mod:`~artifactd.format.archive`: write a family's tree into a reproducible tar+zstd layer.
* :mod:`~artifactd.format.unpack`: check and unpack a layer safely; stage a tree.

Nothing is imported here.
"""
