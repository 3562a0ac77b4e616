"""The engine behind the Horovod API: one background thread per process owns all communication.

User calls enqueue named requests (:mod:`ringtrain.engine.requests`) and get an integer handle
(:mod:`ringtrain.engine.handles`). The ranks meet in negotiation rounds: the controller
(:mod:`ringtrain.engine.controller`) decides which named requests are ready everywhere and in which
order they run, from one summed vector per round (:mod:`ringtrain.engine.negotiation`; a response
cache, :mod:`ringtrain.engine.cache`, makes repeated names cost one entry, and small allreduces ride
in the vector itself, :mod:`ringtrain.engine.eager`). The background thread
(:mod:`ringtrain.engine.background`) drives the rounds and executes the decisions in the same order
on every rank (:mod:`ringtrain.engine.executor`), fusing small allreduces
(:mod:`ringtrain.engine.fusion`), over the groups of :mod:`ringtrain.engine.groups`. Every knob is
read once into :mod:`ringtrain.engine.settings`.
"""
