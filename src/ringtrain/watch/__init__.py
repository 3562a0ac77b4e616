"""The watch: which rank a stuck job waits for, and where it is.

Each rank runs a small thread (:mod:`ringtrain.watch.probe`) that writes, once a second, how far it
got: the number of collectives its torch process group issued (and the last one's name and size),
the Horovod engine's finished and pending requests, and the line of the script it is at. The node's
agent (:mod:`ringtrain.watch.node`) reads those records, decides with :func:`ringtrain.watch.diagnosis.
diagnose` whether the job is stuck and on whom, prints one report, and ends the job at the hang
timeout with that report as its root cause.
"""
