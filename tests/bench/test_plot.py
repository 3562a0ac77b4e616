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


def _projection_legend(body):
    import matplotlib.pyplot as plt

    fig = plot.figure(body)
    try:
        ax = fig.axes[2]
        legend = ax.get_legend()
        drawn = {line.get_label(): line for line in ax.get_lines()}
        return legend.get_title().get_text(), [t.get_text() for t in legend.get_texts()], drawn
    finally:
        plt.close(fig)


def test_the_projection_legend_promises_only_what_is_drawn():
    pytest.importorskip("matplotlib")
    body = sample_body()
    body["settings"]["strategies"] = ["single", "ddp"]  # fp32 on the wire only
    annotate(body)
    title, labels, drawn = _projection_legend(body)
    assert "fp16" not in title
    assert "dotted" not in title
    assert not any("fp16" in label for label in labels)
    assert set(labels) == set(drawn)
    assert {line.get_linestyle() for line in drawn.values()} == {"--"}
    both = sample_body()  # ddp and horovod-fp16: both styles drawn
    annotate(both)
    title, labels, drawn = _projection_legend(both)
    assert title == "dashed fp32, dotted fp16 gradients"
    assert {line.get_linestyle() for line in drawn.values()} == {"--", ":"}
    assert set(labels) == set(drawn)


def test_coinciding_projection_curves_stay_visible():
    """IB and NVLink both reach ~1.0 for a small model: the later curve must not hide the earlier."""
    pytest.importorskip("matplotlib")
    body = sample_body()
    annotate(body)
    _, _, drawn = _projection_legend(body)
    ib, nvlink = drawn["IB-HDR200"], drawn["NVLink4"]
    assert ib.get_marker() != nvlink.get_marker()
    assert ib.get_linewidth() > nvlink.get_linewidth()  # the earlier one shows round the later one
    assert len({line.get_marker() for line in drawn.values() if "fp16" not in line.get_label()}) == \
        len([label for label in drawn if "fp16" not in label])


def test_without_project_there_is_no_projection_panel():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    body = sample_body()
    annotate(body, project=False, validate=False)
    fig = plot.figure(body)
    try:
        assert len(fig.axes) == 2
    finally:
        plt.close(fig)


def test_every_projected_method_has_its_own_line_style_and_the_legend_names_them():
    pytest.importorskip("matplotlib")
    from tests.bench.helpers import method_sweep

    styles = plot.method_styles(["fp32", "powersgd:4", "localsgd:8", "fp16", "localsgd:8"])
    assert list(styles) == ["fp32", "powersgd:4", "localsgd:8", "fp16"]
    assert styles["fp32"] == ("--", "dashed")  # fp32 and fp16 keep the styles of earlier plots
    assert styles["fp16"] == (":", "dotted")
    assert len({style for style, _ in styles.values()}) == len({name for _, name in styles.values()}) == 4
    body = method_sweep()
    annotate(body)
    title, labels, drawn = _projection_legend(body)
    assert title == "dashed fp32, dash-dot powersgd:4, long-dashed localsgd:8"
    assert set(labels) == set(drawn)
    assert {"25GbE", "25GbE powersgd:4", "25GbE localsgd:8"} <= set(drawn)
    assert drawn["25GbE"].get_linestyle() == "--"
    assert drawn["25GbE powersgd:4"].get_linestyle() == "-."
    # the same method on every interconnect: one style
    local = [line for label, line in drawn.items() if label.endswith("localsgd:8")]
    assert len(local) == 5
    assert len({tuple(line._unscaled_dash_pattern[1]) for line in local}) == 1


def test_an_earlier_sweeps_projection_is_still_drawn():
    pytest.importorskip("matplotlib")
    body = sample_body()
    annotate(body)
    for entry in body["projection"]:
        del entry["method"]  # as written before the other methods: fp16 only
    title, labels, drawn = _projection_legend(body)
    assert title == "dashed fp32, dotted fp16 gradients"
    assert "NVLink4 fp16" in drawn
