"""Rule thresholds: the shipped ``defaults.toml`` merged with a user's TOML file.

This is the only I/O the rule engine does.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from diag.ground.capture import CaptureError

Thresholds = dict[str, dict[str, Any]]


class RulesFileError(CaptureError):
    """A rules file that cannot be used; one line naming the file and the key."""


@functools.lru_cache(maxsize=1)
def _shipped() -> Thresholds:
    text = resources.files("rules").joinpath("defaults.toml").read_text(encoding="utf-8")
    return {k: dict(v) for k, v in tomllib.loads(text).items()}


def default_thresholds() -> Thresholds:
    """The shipped defaults (a fresh copy)."""
    return {k: dict(v) for k, v in _shipped().items()}


def default_feature_params() -> dict[str, Any]:
    """The shipped ``[features]`` table: the parameters of :mod:`rules.features` (a fresh copy)."""
    return dict(_shipped()["features"])


def merge_thresholds(base: Thresholds, override: dict[str, Any], where: str = "rules file") -> Thresholds:
    """Overlay ``override`` on ``base``; unknown tables/keys and wrong types raise RulesFileError."""
    out = {k: dict(v) for k, v in base.items()}
    for table, values in override.items():
        if table not in out:
            raise RulesFileError(f"{where}: unknown table [{table}]; known: {', '.join(out)}")
        if not isinstance(values, dict):
            raise RulesFileError(f"{where}: [{table}] must be a table of thresholds")
        for key, value in values.items():
            if key not in out[table]:
                raise RulesFileError(f"{where}: unknown key {table}.{key}; known in [{table}]: {', '.join(out[table])}")
            default = out[table][key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RulesFileError(f"{where}: {table}.{key} must be a number (default {default}), got {value!r}")
            out[table][key] = float(value) if isinstance(default, float) else value
    return out


def load_thresholds(rules_file: str | os.PathLike[str] | None = None) -> Thresholds:
    """Defaults, overridden by ``rules_file`` when given."""
    base = default_thresholds()
    if rules_file is None:
        return base
    path = os.fspath(rules_file)
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise RulesFileError(f"{path}: no such rules file") from None
    except OSError as exc:
        raise RulesFileError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RulesFileError(f"{path}: not valid TOML ({exc})") from None
    return merge_thresholds(base, doc, where=path)
