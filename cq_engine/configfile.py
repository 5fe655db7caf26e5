"""Where the settings file and ``CQ_HOME`` are, with the standard library only: the ``cq`` executable
resolves ``CQ_HOME`` through this before anything else is imported (to find the command agent,
``cq_engine.cli.client``), and ``cq_engine.config`` reads the file through it, so both agree."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

DEFAULT_HOME = "./.cq"


def config_path(env: Mapping[str, str], config_file: str | None = None) -> str:
    """The settings file: ``config_file``, else ``CQ_CONFIG``, else ``cq.toml`` in the working directory."""
    return config_file or env.get("CQ_CONFIG", "cq.toml")


def read_config(path: str) -> dict[str, Any]:
    """The ``[cq]`` table of ``path`` ({} when there is no such file); a syntax error raises
    ``tomllib.TOMLDecodeError``."""
    if not path or not os.path.isfile(path):
        return {}
    import tomllib  # only when there is a file

    with open(path, "rb") as f:
        return tomllib.load(f).get("cq", {})


def home_dir(env: Mapping[str, str], config_file: str | None = None) -> str:
    """``CQ_HOME``, else the file's ``home``, else ``./.cq``: absolute, user and links resolved
    (what ``Path(settings.home).expanduser().resolve()`` gives)."""
    home = env.get("CQ_HOME") or str(read_config(config_path(env, config_file)).get("home") or DEFAULT_HOME)
    return os.path.realpath(os.path.expanduser(home))


def state_dir(home: str) -> str:
    """The local Spark Connect server's state directory (pid, port, token, logs, the agent's socket)."""
    return os.path.join(os.path.realpath(os.path.expanduser(home)), "spark")
