"""cemlib.viz.tables: rendered tables whose text form is the aligned table nbval compares."""

import pytest

from cemlib.viz.tables import collapsed, table


def test_table_text_and_html_hold_the_same_cells():
    t = table([("CEM attention (T=1) vs Llama", 0.04321, "agree"), ("MLP: T=2 vs T=1", "+0.022 ± 0.014", None)],
              ["comparison", "delta", "verdict"], caption="Claims", formats={"delta": "{:+.3f}"})
    text = repr(t)
    assert text.splitlines()[0] == "Claims"
    assert "CEM attention (T=1) vs Llama          +0.043  agree" in text
    assert t.numeric == [False, True, False]
    html = t._repr_html_()
    assert html.count("<tr>") == 3 and "<caption>Claims</caption>" in html
    assert "+0.043" in html and "±" in html and "class='num'" in html
    assert "&lt;" in table([("a<b", 1)], ["x", "y"])._repr_html_()


def test_numbers_are_right_aligned_and_text_left():
    t = table([("a", 1.5), ("bbbb", 10.25)], ["name", "value"])
    lines = repr(t).splitlines()
    assert lines[0] == "name  value" and lines[2] == "a       1.5" and lines[3] == "bbbb  10.25"
    assert t.numeric == [False, True]


def test_bad_rows_are_rejected():
    with pytest.raises(ValueError, match="row 1 has 1 cells"):
        table([(1, 2), (3,)], ["a", "b"])


def test_collapsed_keeps_the_whole_text():
    c = collapsed("1.0 2.0 3.0", "three numbers")
    assert repr(c) == "1.0 2.0 3.0"
    assert "<details" in c._repr_html_() and "<summary>three numbers</summary>" in c._repr_html_()


def test_stacked_table_labels_every_cell_and_keeps_its_text():
    rows = [("T2 below T1", "+0.01 [-0.02, +0.04]", "unresolved")]
    plain, stacked = table(rows, ["claim", "ours", "verdict"]), table(rows, ["claim", "ours", "verdict"], stack=True)
    assert str(plain) == str(stacked)                         # nbval compares the text form
    assert "cemlib-stack" not in plain.to_html() and "data-label" not in plain.to_html()
    html_ = stacked.to_html()
    assert "class='cemlib-table cemlib-stack'" in html_
    assert [m for m in ("data-label='claim'", "data-label='ours'", "data-label='verdict'") if m in html_] == \
        ["data-label='claim'", "data-label='ours'", "data-label='verdict'"]
    assert "data-label='the paper&#x27;s words'" in table([("a",)], ["the paper's words"], stack=True).to_html()
