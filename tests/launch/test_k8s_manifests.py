"""``ringtrain script kubernetes``: every kind's manifest validates against its operator's CRD schema
(tests/launch/data/crds, sources and license in the README there), read back from the printed YAML."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ringtrain.cli.main import main
from ringtrain.launch.k8s_manifests import KINDS, KubernetesJob, render, to_yaml

CRDS = Path(__file__).parent / "data" / "crds"
SCHEMA_FILE = {"trainjob": "trainjobs.json", "pytorchjob": "pytorchjobs.json", "mpijob": "mpijobs.json",
               "jobset": "jobsets.json"}


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as ``kubectl apply``'s strict field validation does."""
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def crd(kind: str) -> dict[str, Any]:
    return json.loads((CRDS / SCHEMA_FILE[kind]).read_text())


def validate(kind: str, document: dict[str, Any]) -> None:
    data = crd(kind)
    assert document["apiVersion"] == f"{data['group']}/{data['version']}"
    assert document["kind"] == data["kind"]
    jsonschema.Draft7Validator(strict(data["openAPIV3Schema"])).validate(document)


def generated(kind: str, **changes: Any) -> list[dict[str, Any]]:
    job = KubernetesJob(**{"kind": kind, "nodes": 2, "nproc_per_node": 4, "image": "registry.example.com/t:1",
                           "command": ("python", "train.py", "--epochs", "2"), "gpus_per_node": 4,
                           "cpu": "16", "memory": "64Gi", **changes})
    return [doc for doc in yaml.safe_load_all(render(job)) if doc is not None]


def containers_of(document: Any) -> list[dict[str, Any]]:
    """Every container in the document, and a TrainJob's ``trainer`` (its runtime's node container)."""
    found: list[dict[str, Any]] = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "containers":
                found.extend(value)
            elif key == "trainer":
                found.append(value)
            else:
                found.extend(containers_of(value))
    elif isinstance(document, list):
        for value in document:
            found.extend(containers_of(value))
    return found


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("changes", [{}, {"nodes": 1, "gpus_per_node": 0, "cpu": None, "memory": None},
                                     {"nodes": 8, "shm_size": "16Gi", "name": "mnist-8n"}])
def test_manifest_validates_against_the_crd(kind: str, changes: dict[str, Any]) -> None:
    documents = generated(kind, **changes)
    assert len(documents) == 1
    validate(kind, documents[0])


def test_schema_check_can_fail() -> None:
    document = generated("pytorchjob")[0]
    document["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate("pytorchjob", document)
    misspelt = generated("jobset")[0]
    misspelt["spec"]["replicatedJob"] = misspelt["spec"].pop("replicatedJobs")
    with pytest.raises(jsonschema.ValidationError, match="replicatedJob"):
        validate("jobset", misspelt)


@pytest.mark.parametrize("kind", KINDS)
def test_secret_shm_and_command(kind: str) -> None:
    text = render(KubernetesJob(kind=kind, nodes=2, nproc_per_node=4, image="img:1",
                                command=("python", "t.py"), name="job"))
    document = yaml.safe_load(text)
    assert "kubectl create secret generic job-secret --from-literal=RINGTRAIN_JOB_SECRET=" in text
    containers = containers_of(document)
    # the ranks' command: ringtrain run with no flags (its values come from the operator's variables)
    runners = [c for c in containers if c.get("command", [])[:2] == ["ringtrain", "run"]]
    assert runners
    assert runners[0]["command"] == ["ringtrain", "run", "python", "t.py"]
    for container in runners:  # the secret comes from the Secret, never inline
        secret = [e for e in container["env"] if e["name"] == "RINGTRAIN_JOB_SECRET"]
        reference = {"secretKeyRef": {"name": "job-secret", "key": "RINGTRAIN_JOB_SECRET"}}
        assert secret == [{"name": "RINGTRAIN_JOB_SECRET", "valueFrom": reference}]
    shm = [c for c in containers if {"name": "dshm", "mountPath": "/dev/shm"} in c.get("volumeMounts", [])]
    assert shm, "no container mounts /dev/shm"
    assert '"8Gi"' in text  # 2 GiB per rank
    assert "medium: Memory" in text


def test_yaml_writer_keeps_types() -> None:
    value = {"a": ["1", 1, True, "true", "-x", "", "a:b", {}], "b": {"c": [], "d": {"e": "no"}},
             "f": [[1, 2]]}
    assert yaml.safe_load(to_yaml(value)) == value


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "0"], "must both be at least 1"),
    (["--name", "Big_Name"], "is not a Kubernetes name"),
    (["--memory", "lots"], "--memory 'lots' is not a Kubernetes quantity"),
    (["--image", " "], "--image is empty"),
])
def test_bad_values_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--kind": "trainjob", "--nodes": "2", "--nproc-per-node": "2", "--image": "img:1"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    args = [item for pair in base.items() for item in pair]
    assert main(["script", "kubernetes", *args, "--", "python", "t.py"]) == 2
    assert message in capsys.readouterr().err


def test_cli_prints_the_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["script", "kubernetes", "--kind", "jobset", "--nodes", "2", "--nproc-per-node", "2",
                 "--image", "img:1", "--name", "mnist", "--", "python", "train.py"]) == 0
    document = yaml.safe_load(capsys.readouterr().out)
    validate("jobset", document)
    env = {e["name"]: e.get("value") for e in containers_of(document)[0]["env"]}
    assert env["MASTER_ADDR"] == "mnist-node-0-0.mnist"
    assert env["PET_NNODES"] == "2"
