"""Restore: pick the artifact a pod needs and install it, crash-safely.

Modules:

* :mod:`~artifactd.restore.source`: the :class:`RestoreSource` protocol (a mounted
  tree; a store, the node store included, through the :class:`StoreSource` adapter).
* :mod:`~artifactd.restore.resolve`: the tag-selection rule and the restore plan.
* :mod:`~artifactd.restore.install`: the mechanism: stage, swap, write the marker.
* :mod:`~artifactd.restore.policy`: the policy: :func:`run_restore`, node store, misses.
* :mod:`~artifactd.restore.destination`: the target directory: lock, staging, swap.
* :mod:`~artifactd.restore.envfile`: the env file a restore writes beside the caches.
* :mod:`~artifactd.restore.journal`: the journal that makes an interrupted restore recoverable.
* :mod:`~artifactd.restore.marker`: the marker a restore leaves (what is installed).
* :mod:`~artifactd.restore.markertypes`: the marker as typed dictionaries (for mypy, schemas).
* :mod:`~artifactd.restore.journaltypes`: the install journal as typed dictionaries (the same).
* :mod:`~artifactd.restore.installed`: the record of restored files libraries rewrite at load.
* :mod:`~artifactd.restore.mounted`: restore from a mounted tree (``--from-dir``, baked stores).
* :mod:`~artifactd.restore.nodefill`: fill the node store with what a restore would pick.
* :mod:`~artifactd.restore.explain`: ``artifactd diff``: read two operands, explain a miss.
* :mod:`~artifactd.restore.predict`: ``artifactd predict``: will the engine's own key match?
* :mod:`~artifactd.restore.engineside`: the pod's side of that key, from the engine's image.

Nothing is imported here: the no-op restore path stays light.
"""
