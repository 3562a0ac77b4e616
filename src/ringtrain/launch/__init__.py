"""The driver: ``ringtrain run`` (hosts, ssh, elastic agent, Slurm/PBS) and ``ringtrain.run(func)``."""
