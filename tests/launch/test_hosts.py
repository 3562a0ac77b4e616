"""Host lists, hostfiles and horovodrun's slot assignment (no processes)."""

import pytest

from ringtrain.exceptions import UsageError
from ringtrain.launch.hosts import (
    HostSlots,
    assign_slots,
    is_local_host,
    nodes_of,
    parse_hostfile,
    parse_hosts,
)


def test_parse_hosts_keeps_order_and_slots():
    assert parse_hosts("b:2,a.example-1:3") == (HostSlots("b", 2), HostSlots("a.example-1", 3))


@pytest.mark.parametrize("spec", ["", "a", "a:", "a:x", "a:2,,b", "a b:2", "a:0", "a:2,a:1", "a:-1"])
def test_malformed_hosts_name_the_entry(spec):
    with pytest.raises(UsageError, match="HINT"):
        parse_hosts(spec)


@pytest.mark.parametrize(("spec", "fixed"), [
    ("a:2,,b:1", "a:2,b:1"),
    ("a:2,", "a:2"),
    (",a:2", "a:2"),
    ("a:2, ,b:1", "a:2,b:1"),
])
def test_empty_host_entry_is_an_error_naming_the_list_and_the_fix(spec, fixed):
    # horovodrun refuses an empty -H entry too (each must match host:slots); dropping it silently
    # would run on fewer hosts than a list written by hand or by a script meant.
    with pytest.raises(UsageError) as caught:
        parse_hosts(spec)
    message = str(caught.value)
    assert f"-H {spec!r} has an empty entry" in message
    assert f"HINT: separate the hosts by single commas: -H {fixed}." in message


def test_hostfile_comments_blank_lines_default_slot(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\nnode1 slots=4\nnode2   slots = 2  # fast\nnode3\n")
    assert parse_hostfile(path) == (HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 1))


@pytest.mark.parametrize("text", ["node1 slots=x\n", "node1 cpus=2\n", "# only a comment\n",
                                  "node1 slots=0\n"])
def test_malformed_hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(UsageError, match=str(path).replace(".", r"\.")):
        parse_hostfile(path)


def test_missing_hostfile(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        parse_hostfile(tmp_path / "nope")


def test_assignment_fills_hosts_in_order_with_cross_ranks():
    got = assign_slots(parse_hosts("a:2,b:1,c:2"), 5)
    table = [(s.rank, s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in got]
    assert table == [
        (0, "a", 0, 2, 0, 3), (1, "a", 1, 2, 0, 2),
        (2, "b", 0, 1, 1, 3),
        (3, "c", 0, 2, 2, 3), (4, "c", 1, 2, 1, 2),
    ]


def test_fewer_ranks_than_slots_uses_the_first_slots():
    got = assign_slots(parse_hosts("a:2,b:2"), 3)
    assert [(s.host, s.local_rank) for s in got] == [("a", 0), ("a", 1), ("b", 0)]
    assert nodes_of(got) == [HostSlots("a", 2), HostSlots("b", 1)]


def test_more_ranks_than_slots_is_an_error():
    with pytest.raises(UsageError, match="-np 5 asks for more processes than the 4 slots"):
        assign_slots(parse_hosts("a:2,b:2"), 5)


def test_uneven_hosts_get_horovods_cross_rank_and_size():
    got = assign_slots(parse_hosts("a:3,b:1,c:2"), 6)
    assert [(s.host, s.local_rank, s.cross_rank, s.cross_size) for s in got] == [
        ("a", 0, 0, 3), ("a", 1, 0, 2), ("a", 2, 0, 1), ("b", 0, 1, 3), ("c", 0, 2, 3), ("c", 1, 1, 2)]


def test_local_host_detection():
    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert not is_local_host("ringtrain-no-such-host.invalid")
