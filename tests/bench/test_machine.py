"""The machine description in scaling.json."""

from ringtrain.bench.machine import describe_machine, one_line


def test_machine_names_cpu_cores_versions_and_date():
    machine = describe_machine()
    for key in ("cpu", "cores", "usable_cores", "memory_bytes", "gpus", "torch", "ringtrain", "python", "os",
                "host", "date"):
        assert key in machine
    assert machine["cores"] >= 1
    assert isinstance(machine["gpus"], list)
    line = one_line(machine)
    assert machine["cpu"] in line
    assert f"torch {machine['torch']}" in line
