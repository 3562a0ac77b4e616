"""The engine behind the Horovod API: one background thread per process owns all communication.

User calls enqueue named requests (:mod:`ringtrain.engine.requests`) and get an integer handle
(:mod:`ringtrain.engine.handles`). The threads of all ranks meet in negotiation rounds
(:mod:`ringtrain.engine.negotiation`) over a small gloo control group, agree on which named requests
are ready everywhere (a response cache, :mod:`ringtrain.engine.cache`, makes repeated names cost one
tiny allreduce), and then execute them in the same order on every rank
(:mod:`ringtrain.engine.executor`), fusing small allreduces (:mod:`ringtrain.engine.fusion`).
"""
