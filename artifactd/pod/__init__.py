"""The pod: run the engine, and tell whether the restored caches were used.

Modules:

* :mod:`~artifactd.pod.exec`: ``artifactd exec``: restore, then become the engine.
* :mod:`~artifactd.pod.status`: ``status``: did the engine compile anyway.
* :mod:`~artifactd.pod.verdict`: the one "compiled anyway" verdict.
* :mod:`~artifactd.pod.enginelogs`: evidence from the engines' logs.
* :mod:`~artifactd.pod.metrics`: Prometheus metrics of restores and verdicts.

Nothing is imported here.
"""
