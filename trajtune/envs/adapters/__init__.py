"""Adapters: task libraries that already exist, as trajtune tasks and environments.

    reasoning_gym.py   reasoning-gym datasets -> single-turn tasks, scored by the dataset's `score_answer`
    textarena.py       TextArena games -> multi-turn episodes (the game's messages are the TOOL turns)

Each library is an optional install (`pip install trajtune[textarena]`, `pip install reasoning-gym`);
importing an adapter without its library is fine, using it says what to install. Adapters sit
beside `trajtune.envs` in the layering: they know nothing about models, only text.

verifiers (prime-rl's environment standard) has no adapter: its rollouts run the agent as a
separate program that reaches the model over HTTP; see docs/adapters.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ...config import ConfigError


class MissingPackage(ConfigError, ImportError):
    """An adapter's library is not installed: a user error (the command line says it in one line, exit 2),
    and an ImportError for code that tries an optional import."""


def require(module: str, install: str) -> ModuleType:
    """Import an optional library, or fail with the command that installs it (`MissingPackage`)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackage(f"this adapter needs the {module!r} package: {install} ({e})") from e
