"""The user's defaults: where results go and which hosts inventory to use, so that a nightly
cron line or a lab member need not repeat ``--results`` and ``--hosts``.

Where each setting comes from, first found wins:

* results folder: ``--results`` > ``$ORCHESTRATE_RESULTS`` > ``results`` of the config file >
  ``./results``;
* hosts inventory (ssh backend): ``--hosts`` > ``[matrix] hosts`` > ``$ORCHESTRATE_HOSTS`` >
  ``hosts`` of the config file.

The config file is ``$ORCHESTRATE_CONFIG``, else ``$XDG_CONFIG_HOME/orchestrate/config.toml``
(``~/.config/orchestrate/config.toml``); a missing file is no setting. It is TOML, validated
strictly (an unknown key or a wrong type is a :class:`~orchestrator.errors.ConfigError` naming
the file and the field)::

    results = "/data/bench/results"     # relative paths: from this file's folder; ~ expands
    hosts = "~/lab/hosts.toml"

    [publish]                           # where runs are published (orchestrator.config.publish)
    mlflow = "http://mlflow.lab.example:5000"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError

from orchestrator.config.files import StrictModel, problems_from_validation, read_toml
from orchestrator.config.publish import PublishSettings
from orchestrator.errors import ConfigError

CONFIG_ENV = "ORCHESTRATE_CONFIG"
RESULTS_ENV = "ORCHESTRATE_RESULTS"
HOSTS_ENV = "ORCHESTRATE_HOSTS"
DEFAULT_RESULTS = Path("results")


#: A path of the config file: no NUL byte or control character (no file can be named so).
ConfigPath = Annotated[str, Field(min_length=1, max_length=4096,
                                  pattern=r"^[^\x00-\x1f\x7f]+$")]


class UserConfig(StrictModel):
    """``config.toml``: the user's defaults."""

    results: ConfigPath | None = None
    hosts: ConfigPath | None = None
    #: ``[publish]``: the lab's MLflow server / collector (:mod:`orchestrator.config.publish`).
    publish: PublishSettings = PublishSettings()


def config_path() -> Path:
    """The config file's path (it need not exist)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "orchestrate" / "config.toml"


def load_user_config(path: Path | None = None) -> tuple[UserConfig, Path]:
    """The user's config (defaults when the file does not exist) and its path."""
    path = path or config_path()
    if not path.exists():
        return UserConfig(), path
    raw = read_toml(path)
    try:
        return UserConfig.model_validate(raw), path
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(
            str(path), exc, keys_hint="known keys: results, hosts, publish")) from None


def _from_file(value: str, config: Path, key: str) -> Path:
    """A path written in the config file: ``~`` expanded, relative to the file's folder."""
    path = _expanded(value, str(config), key)
    return path if path.is_absolute() else config.parent / path


def _expanded(value: str, file: str | None, field: str) -> Path:
    """``value`` with ``~`` / ``~user`` expanded; a ConfigError naming where it was written
    when there is no such user (or no home folder)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        user = value[1:].split("/", 1)[0]
        who = f"no user {user!r} here" if user else "no home folder is known here"
        raise ConfigError(f"{value!r}: {who} to expand '~' for; write the path out",
                          file=file or "", field=field) from None


#: --help text of every command's --results.
RESULTS_HELP = ("results root (default: $ORCHESTRATE_RESULTS, else `results` in the user's "
                "config file, else ./results)")


def results_root(cli: Path | None = None) -> Path:
    """The results folder: ``--results`` > $ORCHESTRATE_RESULTS > the config file > ./results."""
    if cli is not None:
        return cli
    return _default(RESULTS_ENV, "results") or DEFAULT_RESULTS


def hosts_file(cli: Path | None = None, matrix_hosts: Path | None = None) -> Path | None:
    """The hosts inventory: ``--hosts`` > ``[matrix] hosts`` > $ORCHESTRATE_HOSTS > the config
    file (None: none given anywhere)."""
    if cli is not None:
        return cli
    if matrix_hosts is not None:
        return matrix_hosts
    return _default(HOSTS_ENV, "hosts")


def _default(env: str, key: str) -> Path | None:
    """The user's default path: ``$env``, else ``key`` of the config file (None: neither)."""
    if os.environ.get(env):
        return _expanded(os.environ[env], None, f"${env}")
    config, path = load_user_config()
    value = getattr(config, key)
    return _from_file(value, path, key) if value else None
