"""``RayExecutor.create_settings``: checked values, ignored ssh options that never show."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray.settings import create_settings


def test_defaults_and_values() -> None:
    settings = create_settings()
    assert (settings.timeout_s, settings.placement_group_timeout_s, settings.nics) == (30, 100, None)
    settings = create_settings(timeout_s=5, placement_group_timeout_s=2.5, nics={"eth1", "eth0"})
    assert (settings.timeout_s, settings.placement_group_timeout_s) == (5, 2.5)
    assert settings.nics == ("eth0", "eth1")
    assert create_settings(nics="eth0,eth1").nics == ("eth0", "eth1")


@pytest.mark.parametrize(("name", "value"), [("timeout_s", 0), ("timeout_s", -1), ("timeout_s", "30"),
                                             ("placement_group_timeout_s", float("inf")),
                                             ("placement_group_timeout_s", True)])
def test_bad_timeouts_are_named(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        create_settings(**{name: value})


def test_bad_nics_are_named() -> None:
    with pytest.raises(ValueError, match="nics"):
        create_settings(nics=[""])


def test_ssh_options_are_accepted_and_a_key_is_never_written_or_shown(tmp_path) -> None:
    key_file = tmp_path / "id_rsa"
    settings = create_settings(ssh_identity_file=str(key_file), ssh_str="-----BEGIN PRIVATE KEY----- secret")
    assert not key_file.exists()
    assert "PRIVATE" not in repr(settings)
