"""Grid filters (dashboard/gridfilter.py): by class and by id, with the count of what is shown."""

from __future__ import annotations

import pytest

from munkey_core.dashboard.gridfilter import GridFilter, filter_grid, parse_id_query
from munkey_core.errors import MunkeyError

IDS = [5, 17, 40, 41, 60, 99, 100, 250]
LABELS = [1, 3, 1, 8, 3, 1, 8, 0]


def test_id_query_reads_ids_and_ranges() -> None:
    assert parse_id_query("") == [] and parse_id_query("   ") == []
    assert parse_id_query("12, 40-60 100..120; 7 to 3") == [(12, 12), (40, 60), (100, 120), (3, 7)]
    assert parse_id_query("40 - 60") == [(40, 60)]
    with pytest.raises(MunkeyError, match="40-60"):
        parse_id_query("ids please")


def test_no_filter_shows_everything_up_to_the_limit() -> None:
    view = filter_grid(IDS, LABELS, GridFilter())
    assert view.rows.tolist() == list(range(8)) and view.caption == "Showing 8 of 8."
    view = filter_grid(IDS, LABELS, GridFilter(), limit=3)
    assert view.rows.tolist() == [0, 1, 2] and view.caption == "Showing 3 of 8."


def test_class_and_id_filters_combine() -> None:
    view = filter_grid(IDS, LABELS, GridFilter(classes=(1,)))
    assert [IDS[j] for j in view.rows] == [5, 40, 99]
    assert view.caption == "Showing 3 of 3 matching the filter (8 in all)."
    view = filter_grid(IDS, LABELS, GridFilter(classes=(1, 8), id_query="30-100"))
    assert [IDS[j] for j in view.rows] == [40, 41, 99, 100]
    view = filter_grid(IDS, LABELS, GridFilter(id_query="17, 250"), limit=1)
    assert [IDS[j] for j in view.rows] == [17] and view.caption == "Showing 1 of 2 matching the filter (8 in all)."


def test_nothing_matching_says_how_to_see_them_again() -> None:
    view = filter_grid(IDS, LABELS, GridFilter(classes=(9,)))
    assert view.shown == 0 and "clear the class or id filter" in view.caption
    assert filter_grid([], [], GridFilter()).caption == "Nothing to show."
    for v in (view, filter_grid(IDS, LABELS, GridFilter(id_query="1-5"))):
        assert "None" not in v.caption and "nan" not in v.caption
