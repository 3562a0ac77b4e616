"""``python -m ringtrain.launch.node_entry CONFIG_JSON``: what a driver starts on each host and srun task.

A real agent started this way is exercised in test_driver.py (and over ssh and srun in tests/integration).
"""

from __future__ import annotations

from ringtrain.launch import node_entry
from ringtrain.launch.config import LaunchConfig


def test_node_entry_refuses_a_hand_made_call(capsys):
    assert node_entry.main([]) == 2
    assert "usage: python -m ringtrain.launch.node_entry CONFIG_JSON" in capsys.readouterr().err
    assert node_entry.main(["{not json"]) == 2
    assert "the node's configuration cannot be read" in capsys.readouterr().err
    assert node_entry.main(['{"command": ["x"], "no_such_field": 1}']) == 2
    assert "HINT: install the same ringtrain version" in capsys.readouterr().err


def test_node_entry_turns_a_usage_error_into_exit_2(capsys):
    config = LaunchConfig(command=("ringtrain-no-such-command-xyz",))
    assert node_entry.main([config.to_json()]) == 2
    err = capsys.readouterr().err
    assert "ringtrain run: error: command not found: 'ringtrain-no-such-command-xyz'" in err
