"""The suite's order (tests/ordering.py): the longest modules first, each whole and in its order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tests import ordering


@dataclass
class FakeItem:
    nodeid: str
    marks: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


ITEMS = [FakeItem("tests/a.py::t1"), FakeItem("tests/a.py::t2"),
         FakeItem("tests/b.py::t1", {"slow"}), FakeItem("tests/b.py::t2"),
         FakeItem("tests/c.py::t1", {"slow", "integration"}), FakeItem("tests/c.py::t2", {"slow"}),
         FakeItem("tests/d.py::t1", {"slow"})]


def ids(items):
    return [item.nodeid for item in items]


def test_measured_seconds_decide_and_each_module_stays_whole_and_in_order():
    seconds = {"tests/a.py": 50.0, "tests/b.py": 5.0, "tests/c.py": 30.0}
    ordered = ordering.longest_modules_first(ITEMS, seconds)
    # d is not measured: its one slow test counts HEAVY_SECONDS (10), between c and b
    assert ids(ordered) == ["tests/a.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/c.py::t2",
                            "tests/d.py::t1", "tests/b.py::t1", "tests/b.py::t2"]


def test_without_measurements_the_slow_and_integration_tests_weigh():
    ordered = ordering.longest_modules_first(ITEMS, {})
    assert ids(ordered) == ["tests/c.py::t1", "tests/c.py::t2",  # two heavy tests
                            "tests/b.py::t1", "tests/b.py::t2",  # one each: b before d, as collected
                            "tests/d.py::t1", "tests/a.py::t1", "tests/a.py::t2"]


def test_the_table_is_written_from_a_durations_report(tmp_path, monkeypatch):
    report = tmp_path / "durations.txt"
    report.write_text("============ slowest durations ============\n"
                      "12.50s call     tests/x.py::test_one[a]\n"
                      "0.40s setup    tests/x.py::test_one[a]\n"
                      "30.00s call     tests/y/test_z.py::TestK::test_two\n"
                      "(2 durations < 0.005s hidden.)\n")
    monkeypatch.setattr(ordering, "SECONDS_FILE", tmp_path / "module_seconds.json")
    assert ordering.main([str(report)]) == 0
    table = json.loads((tmp_path / "module_seconds.json").read_text())["modules"]
    assert table == {"tests/y/test_z.py": 30.0, "tests/x.py": 12.9}
    assert ordering.measured_seconds(tmp_path / "module_seconds.json") == table
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing\n")
    assert ordering.main([str(empty)]) == 2


def test_a_missing_or_broken_table_falls_back_to_the_estimate(tmp_path):
    assert ordering.measured_seconds(tmp_path / "none.json") == {}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert ordering.measured_seconds(broken) == {}
