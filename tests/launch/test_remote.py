"""What reaches another host over ssh (launch/remote.py): the forwarded environment, never the secret."""

from __future__ import annotations

from ringtrain.launch.remote import forwarded_environment, remote_command

SECRET = "e" * 64


def test_the_secret_and_the_store_address_are_never_forwarded_on_the_command_line():
    environ = {"PATH": "/bin", "HOROVOD_CYCLE_TIME": "3", "RINGTRAIN_JOB_SECRET": SECRET,
               "RINGTRAIN_JOB_STORE": "10.0.0.1:4000", "RINGTRAIN_ROUND_TIMEOUT_SECONDS": "60"}
    env = forwarded_environment(environ)
    assert env == {"PATH": "/bin", "HOROVOD_CYCLE_TIME": "3", "RINGTRAIN_ROUND_TIMEOUT_SECONDS": "60"}
    command = remote_command("hostB", ["python", "-m", "ringtrain.launch.node_entry", "{}"], env, "/w",
                             None, None, 10)
    assert SECRET not in " ".join(command)
    assert "RINGTRAIN_JOB_STORE" not in " ".join(command)
