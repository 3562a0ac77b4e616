"""scaling.png: drawn when matplotlib is there, a message with the install command when not."""

import pytest

from ringtrain.bench import plot
from ringtrain.bench.analysis import annotate
from tests.bench.helpers import sample_body

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    body = sample_body()
    annotate(body)
    assert plot.write_plot(body, tmp_path / "scaling.png") is None
    data = (tmp_path / "scaling.png").read_bytes()
    assert data.startswith(PNG)
    assert len(data) > 10_000


def test_a_script_without_throughput_is_plotted_by_wall_time(tmp_path):
    pytest.importorskip("matplotlib")
    body = sample_body(link=False)
    for row in body["rows"]:
        row.update(items_per_second=None, items_per_second_min=None, items_per_second_max=None,
                   speedup_from="wall time")
    assert plot.write_plot(body, tmp_path / "scaling.png") is None
    assert (tmp_path / "scaling.png").read_bytes().startswith(PNG)


def test_without_matplotlib_the_message_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    message = plot.write_plot(sample_body(), tmp_path / "scaling.png")
    assert "pip install 'ringtrain[plot]'" in message
    assert not (tmp_path / "scaling.png").exists()
