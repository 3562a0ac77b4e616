"""One rank of ``ringtrain train``: bad input goes to the agent's error file, for the report to tell once."""

from __future__ import annotations

import json

from ringtrain.train.job import TrainJob
from ringtrain.train.worker import main, report_to_agent


def test_report_to_agent_writes_torch_s_layout_without_a_traceback(tmp_path):
    path = tmp_path / "error.json"
    assert report_to_agent("--data-dir x lacks the files. HINT: copy them", str(path))
    body = json.loads(path.read_text())["message"]
    assert body["message"] == "--data-dir x lacks the files. HINT: copy them"
    assert body["extraInfo"]["py_callstack"] == ""
    assert float(body["extraInfo"]["time"]) > 0
    assert not report_to_agent("x", None)
    assert not report_to_agent("x", str(tmp_path / "no" / "such" / "folder" / "error.json"))


def test_bad_input_under_an_agent_is_left_for_the_report_not_printed(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job.json"
    job.write_text(TrainJob(workload="mnist", data_dir=str(tmp_path)).to_json())  # no MNIST files there
    errors = tmp_path / "errors"
    errors.mkdir()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    assert main(["--job", str(job), "--error-dir", str(errors)]) == 2
    assert capsys.readouterr().err == ""
    message = (errors / "rank-1.txt").read_text().strip()
    assert "HINT:" in message
    assert (errors / "rank-1.reported").exists()
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == message
    # without an agent to report it, the rank says it itself
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    assert main(["--job", str(job)]) == 2
    assert f"ringtrain train: error (rank 1): {message}" in capsys.readouterr().err


def test_the_job_given_inline_and_an_error_folder_this_node_lacks(tmp_path, monkeypatch, capsys):
    """A rank on another Ray node gets the job in its command, and the launcher's error folder is not
    there: it reports as any rank without one."""
    text = TrainJob(workload="mnist", data_dir=str(tmp_path)).to_json()  # no MNIST files there
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert main(["--job-json", text, "--error-dir", str(tmp_path / "on-the-launchers-node")]) == 2
    assert "ringtrain train: error (rank 1): " in capsys.readouterr().err
    assert not (tmp_path / "on-the-launchers-node").exists()
