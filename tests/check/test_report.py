"""``ringtrain.check.report``: the verdict of a report, its JSON view, and ranks grouped by host."""

from __future__ import annotations

from ringtrain.check.machine import new_report
from ringtrain.check.report import CheckResult, hello_line, summarize_hosts
from tests.check.stand_in import CPU, site, world_of_one


def test_report_verdict_and_json_view():
    report = new_report(world_of_one(), CPU, "single")
    assert (report.rank, report.size, report.environment, report.device) == (0, 1, "single", "cpu")
    assert report.backends["gloo"] is True
    assert report.control_plane == "none (one process)"
    assert report.ok
    report.results += [CheckResult("a", True), CheckResult("b", False, "wrong"),
                       CheckResult("c", True, "declined", skipped=True)]
    assert [r.name for r in report.failures] == ["b"]
    assert not report.ok
    data = report.to_dict()
    assert data["ok"] is False
    assert data["results"][1] == {"name": "b", "ok": False, "detail": "wrong", "skipped": False}
    assert hello_line(report).startswith("hello from rank 0 of 1 (host ")


def test_hosts_group_ranks_in_order_of_first_appearance():
    sites = [site(0, "a"), site(1, "a"), site(2, "b"), site(3, "a")]
    hosts = summarize_hosts(sites)
    assert [(h.host, h.ranks) for h in hosts] == [("a", (0, 1, 3)), ("b", (2,))]
