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
