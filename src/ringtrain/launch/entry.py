"""``launch(config)``: the one entry point of every job, fixed-size or elastic, on any backend.

It chooses the driver once, from the configuration: Ray's (``--ray``, :mod:`ringtrain.launch.ray.driver`,
loaded only then), the elastic driver (``--min-np``/``--max-np``/``--host-discovery-script``,
:mod:`ringtrain.launch.elastic_driver`) or the fixed-size one (:mod:`ringtrain.launch.driver`: this node,
hosts, an ``srun`` step). ``ringtrain run``, ``ringtrain train``, ``ringtrain.run(fn)`` and a node's agent
all start here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.driver import check_build, check_command, launch_fixed, prepare
from ringtrain.launch.report import PREEMPTED_EXIT
from ringtrain.launch.requeue import requeue_job


def launch(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run ``config.command`` as the configured ranks; returns the launcher's exit code.

    With ``config.requeue``, a job whose ranks ended preempted requeues its batch job (launch/requeue.py).
    """
    environ = dict(os.environ if environ is None else environ)
    code = _launch(config, environ)
    if config.requeue and code == PREEMPTED_EXIT:
        return requeue_job(environ)
    return code


def _launch(config: LaunchConfig, environ: dict[str, str]) -> int:
    if config.check_build:
        print(check_build())
        return 0
    if config.ray is not None:
        from ringtrain.launch.ray.driver import launch_on_ray  # the ray extra: loaded for --ray only

        return launch_on_ray(config, environ)
    if config.elastic:
        from ringtrain.launch.elastic_driver import launch_elastic

        prepare(config, environ)
        check_command(config.command, config.no_python)
        return launch_elastic(config, environ)
    return launch_fixed(config, environ)
