"""``IMP_OPTIMIZATIONS``: switches and sizes parse, unknown names are refused with the list of known ones."""

from __future__ import annotations

import pytest

from imp_core.config import Optimizations
from imp_core.errors import ConfigError


def test_everything_is_on_by_default() -> None:
    opts = Optimizations.parse(None)
    assert opts.partner_index and opts.bloom_filters and opts.join_key_pushdown and opts.netting
    assert opts.small_side_in_memory and opts.selection_pushdown


def test_switches_and_sizes() -> None:
    opts = Optimizations.parse("-partners,-bloom,partner_rows=500,topk_buffer=20,side_cache_rows=7")
    assert not opts.partner_index and not opts.bloom_filters and opts.netting
    assert (opts.partner_rows, opts.topk_buffer, opts.side_cache_rows) == (500, 20, 7)
    assert not any([Optimizations.parse("none").partner_index, Optimizations.parse("none").join_key_pushdown])


@pytest.mark.parametrize(
    "text, named", [("-partner", "'partner'"), ("partner_rows=many", "partner_rows"), ("rows=5", "'rows'")]
)
def test_bad_settings_name_what_is_wrong(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Optimizations.parse(text)
