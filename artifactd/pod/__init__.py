"""The pod: run the engine, and tell whether the restored caches were used.

Modules:

* :mod:`~artifactd.pod.exec`: ``artifactd exec``: restore, then become the engine.
* :mod:`~artifactd.pod.status`: ``status``: did the engine compile anyway.
* :mod:`~artifactd.pod.verdict`: the one "compiled anyway" verdict.
* :mod:`~artifactd.pod.enginelogs`: evidence from the engines' logs.
* :mod:`~artifactd.pod.metrics`: Prometheus metrics of restores and verdicts.
* :mod:`~artifactd.pod.phases`: the engine's start, phase by phase, from its log.
* :mod:`~artifactd.pod.readiness`: the ``serviceable``, ``prewarmed`` and ``verified``
  levels (``status --ready``).
* :mod:`~artifactd.pod.coldstart`: ``exec --on-canary-fail cold``: replay the canary once the
  engine is up, restart it cold once if it fails.
* :mod:`~artifactd.pod.canary`: the canary's one owner: record it (build), replay and
  compare it (``verify``, ``status --canary``).
* :mod:`~artifactd.pod.nodefeatures`: the node store's artifacts as node-feature-discovery labels.
* :mod:`~artifactd.pod.contribute`: publish what a pod compiled anyway as a ``kind: delta``.

Nothing is imported here.
"""
