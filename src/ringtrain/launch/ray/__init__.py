"""The launcher's Ray backend (``ringtrain run --ray``): its driver (:mod:`.driver`), the elastic driver's
Ray hosts (:mod:`.elastic`), the node actor (:mod:`.actor`), the bridge that outlives it (:mod:`.bridge`)
and the two rank groups a driver supervises (:mod:`.group`, :mod:`.bridged_group`).

Nothing here imports ``ray`` at import time: the ``ray`` extra is needed only for a ``--ray`` job.
(Horovod's ``RayExecutor`` API is :mod:`ringtrain.ray`, a layer below the launcher.)
"""
