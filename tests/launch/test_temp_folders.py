"""A SIGKILL'd launcher's temporary folder is removed at the next start; live or foreign ones are kept."""

import os
import signal
import subprocess
import sys

from ringtrain.launch import temp_folders

MAKE = "import sys; from ringtrain.launch.temp_folders import make_temp_folder; " \
       "print(make_temp_folder(sys.argv[1]), flush=True); sys.stdin.read()"


def test_the_folder_of_a_killed_launcher_goes_at_the_next_start_and_a_live_ones_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(temp_folders.tempfile, "tempdir", None)  # read TMPDIR again
    prefix = "ringtrain-test-"
    procs = [subprocess.Popen([sys.executable, "-c", MAKE, prefix], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
             for _ in range(2)]
    try:
        dead, live = (p.stdout.readline().strip() for p in procs)
        assert dead.startswith(str(tmp_path / prefix))
        (tmp_path / dead / "job.json").write_text("{}")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=60)
        foreign = tmp_path / f"{prefix}otherhost-{procs[0].pid}-abc"  # another host's, same pid
        foreign.mkdir()
        mine = temp_folders.make_temp_folder(prefix)
        assert mine.is_dir()
        assert f"-{os.getpid()}-" in mine.name
        assert not os.path.exists(dead)
        assert os.path.isdir(live)
        assert foreign.is_dir()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
