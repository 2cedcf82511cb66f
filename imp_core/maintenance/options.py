"""Engine options that shape operator state, recorded with each sketch version.

Some optimizations only change how fast maintenance runs (selection and join-key push-down, netting); they may
differ from one maintaining process to the next. Others decide *what the operator state holds*: a bounded top-k or
MIN/MAX buffer keeps only the best rows, a join keeps a small side whole, a partner index or a Bloom filter. State
built under one setting and maintained under another can be silently wrong (a top-k buffer of 3 loaded as an
unbounded one never notices it ran dry). So the state-shaping options are taken from the environment once, at
capture, stored with every version (``sketch_version.state_options``) and used from there on load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from imp_core.config import Optimizations
from imp_core.errors import StateError

# Fields of ``Optimizations`` whose value changes what an operator keeps in its state.
STATE_OPTIONS = ("topk_buffer", "minmax_buffer", "bloom_filters", "small_side_in_memory", "small_side_rows",
                 "partner_index", "partner_rows")


def state_options(opts: Optimizations) -> dict[str, Any]:
    """The state-shaping subset of ``opts``, as stored with a sketch version."""
    return {name: getattr(opts, name) for name in STATE_OPTIONS}


def with_state_options(opts: Optimizations, stored: Mapping[str, Any], sketch: str) -> Optimizations:
    """``opts`` (this process's settings) with the state-shaping options replaced by the stored ones.

    Raises:
        StateError: ``stored`` lacks an option or names one this imp does not know (written by another release);
            the service answers with a recapture, which records this release's options.
    """
    unknown = sorted(set(stored) - set(STATE_OPTIONS))
    missing = [name for name in STATE_OPTIONS if name not in stored]
    if unknown or missing:
        what = f"unknown engine option(s) {', '.join(unknown)}" if unknown else \
            f"no value for engine option(s) {', '.join(missing)}"
        raise StateError(f"sketch {sketch}: its operator state was recorded with {what}; recapture the sketch")
    fields = {f.name: f.type for f in dataclasses.fields(Optimizations)}
    values: dict[str, Any] = {}
    for name in STATE_OPTIONS:
        value = stored[name]
        want_bool = fields[name] in (bool, "bool")
        if (want_bool and not isinstance(value, bool)) or (not want_bool and (isinstance(value, bool)
                                                                              or not isinstance(value, int))):
            raise StateError(f"sketch {sketch}: stored engine option {name}={value!r} has the wrong type; recapture "
                             f"the sketch")
        values[name] = value
    return dataclasses.replace(opts, **values)


__all__ = ["STATE_OPTIONS", "state_options", "with_state_options"]
