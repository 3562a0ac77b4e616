"""docs/architecture.md against the code: the table of places, the Backend interface and the files the
launcher's walkthrough names are what the package has."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from ringtrain.launch import backend, backends, hosts_backend
from ringtrain.launch.places import PLACES

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.md").read_text()
LAUNCH = ROOT / "src" / "ringtrain" / "launch"


def test_every_place_of_the_table_is_on_the_page_with_its_module() -> None:
    for name in PLACES:
        group = PLACES[name]
        module = Path(inspect.getfile(group)).relative_to(LAUNCH).as_posix()
        assert f'"{name}"' in PAGE, name
        assert module in PAGE, (name, module)


def test_the_page_names_no_place_the_table_lacks() -> None:
    listed = re.search(r"^launch/places/\s+PLACES: (.*?)\n(?=launch/)", PAGE, re.MULTILINE | re.DOTALL)
    assert listed is not None
    assert set(re.findall(r'"([a-z-]+)"', listed.group(1))) == set(PLACES)


def test_every_member_of_the_backend_interface_is_in_the_walkthrough_table() -> None:
    members = [name for name, _ in inspect.getmembers(backend.Backend, inspect.isfunction)
               if not name.startswith("_")]
    assert members  # the interface has members to document
    walkthrough = PAGE[PAGE.index("## Adding a backend"):]
    rows = set(re.findall(r"^\s*\| `([a-z_]+)\(", walkthrough, re.MULTILINE))
    assert rows == set(members)


def test_the_walkthroughs_example_backend_implements_the_interface() -> None:
    assert "HostsBackend" in PAGE
    assert "select_backend()" in PAGE
    members = {name for name, _ in inspect.getmembers(backend.Backend, inspect.isfunction)
               if not name.startswith("_")}
    assert members <= set(dir(hosts_backend.HostsBackend))
    assert callable(backends.select_backend)


def test_the_launcher_files_the_page_names_exist() -> None:
    # paths of the launcher's own files (not the tests' or src/ringtrain/...'s, which a "/" precedes)
    named = set(re.findall(r"(?<![\w/])((?:launch/)?(?:places/|ray/)?[a-z_]+\.py)\b", PAGE))
    launch_files = {p.relative_to(LAUNCH).as_posix() for p in LAUNCH.rglob("*.py")}
    for name in named:
        bare = name.removeprefix("launch/")
        if bare.startswith(("places/", "ray/")) or name.startswith("launch/") or bare in launch_files:
            assert bare in launch_files, name
