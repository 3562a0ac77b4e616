"""The Ray place's actor class, as a plain object (no Ray needed): it runs the agent's command as its
child, hands it the secret line, relays its output in order and passes the link's requests on.

Through Ray (actors, a lost node) it is tested in tests/launch/ray/test_driver.py and
tests/integration/test_ray_two_hosts.py.
"""

from __future__ import annotations

import sys

import pytest

from ringtrain.launch.ray.actor import NodeAgentActor

#: A stand-in agent: reads the secret line, says so, then echoes the link's lines until "stop".
AGENT = """
import sys
secret = sys.stdin.readline()
print(f"secret line {secret!r}", flush=True)
for line in sys.stdin:
    if line.strip() == "stop":
        print("stopping", file=sys.stderr, flush=True)
        raise SystemExit(143)
    print(f"heard {line.strip()!r}", flush=True)
"""


def drain(actor: NodeAgentActor) -> tuple[list[tuple[bool, str]], int]:
    """Everything the agent said until it ended, and its exit status."""
    lines: list[tuple[bool, str]] = []
    while True:
        got, code = actor.output(wait_s=30)
        lines += got
        if code is not None:
            return lines, code


@pytest.mark.slow
def test_the_actor_runs_the_agent_and_carries_the_link():
    actor = NodeAgentActor()
    # argv[0] is replaced by the actor's own interpreter (the driver's may not exist on that node)
    pid = actor.start(["/no/such/python-on-this-node", "-c", AGENT], {"EXTRA": "1"}, [])
    assert pid > 0
    assert actor.send(b"\n")  # a heartbeat
    assert actor.send(b"stop\n")
    lines, code = drain(actor)
    assert code == 143
    # in order within each stream (the two streams are read by two threads)
    assert [line for is_err, line in lines if not is_err] == ["secret line '\\n'\n", "heard ''\n"]
    assert [line for is_err, line in lines if is_err] == ["stopping\n"]


@pytest.mark.slow
def test_kill_ends_the_agent_and_a_closed_stdin_is_end_of_file():
    actor = NodeAgentActor()
    actor.start(["python", "-c", "import sys, time; sys.stdin.readline(); time.sleep(600)"], {}, [])
    actor.kill()
    _, code = drain(actor)
    assert code == -9
    assert not actor.send(b"\n")  # nothing left to write to
    actor.close_stdin()


@pytest.mark.slow
def test_the_actor_module_imports_no_torch():
    """Every bundle's actor imports it first: torch would cost each seconds before the agent starts."""
    import subprocess

    code = "import sys, ringtrain.launch.ray.actor; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_the_agent_gets_the_actors_environment_less_what_ray_sets_for_its_worker():
    from ringtrain.launch.ray.actor import agent_environment

    actor = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "RAY_worker_niceness": "0", "RAY_JOB_ID": "01000000",
             "RAY_RAYLET_PID": "42", "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace", "RAY_ADDRESS": "h:6379"}
    assert agent_environment(actor, {"RINGTRAIN_X": "1"}) == {"PATH": "/bin", "RAY_ADDRESS": "h:6379",
                                                              "RINGTRAIN_X": "1"}
    # a debugger the user chose is theirs; what the driver sends wins
    assert agent_environment({"PYTHONBREAKPOINT": "ipdb.set_trace"}, {"OMP_NUM_THREADS": "4"}) == {
        "PYTHONBREAKPOINT": "ipdb.set_trace", "OMP_NUM_THREADS": "4"}
