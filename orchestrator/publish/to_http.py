"""A run to an HTTP collector: one JSON document per cell, POSTed to a URL (as ReFrame's
``httpjson`` perflog handler does), for Elastic, Loki, a Grafana data source or a lab's own
service.

Each request is ``POST URL`` with ``Content-Type: application/json`` and the body of
:func:`orchestrator.publish.documents.cell_document` plus ``fingerprint`` (and ``replaces``, the
fingerprint of what was sent of the cell before, when its data changed: a ``--resume``). Any
2xx answer is taken as received. Headers come from the environment only:
``ORCHESTRATE_HTTP_HEADER_<NAME>=value`` sends ``<Name>: value`` (underscores become dashes:
``ORCHESTRATE_HTTP_HEADER_AUTHORIZATION="Bearer ..."`` sends ``Authorization``,
``ORCHESTRATE_HTTP_HEADER_X_SCOPE_ORGID=lab`` sends ``X-Scope-Orgid``); their values are never
written or logged, and are masked in any answer quoted in an error.

What was received is recorded (:func:`publish` updates the ``sent`` table the caller keeps in
the run folder's ``publish.json``): a repeat sends only the cells not yet received or whose
fingerprint changed, and a publish cut short by a server going away goes on where it stopped.
The first failure stops the publish: the cells after it would meet the same server.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from orchestrator.config.redact import Scrubber
from orchestrator.errors import ConfigError, Problem
from orchestrator.publish.documents import RunDoc
from orchestrator.publish.outcome import Counts, PublishError

#: ``ORCHESTRATE_HTTP_HEADER_<NAME>``: a header of every request to a collector.
HEADER_PREFIX = "ORCHESTRATE_HTTP_HEADER_"
_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def headers_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The collector's headers: each ``ORCHESTRATE_HTTP_HEADER_<NAME>`` variable as
    ``<Name>: value``; a name or value HTTP cannot carry is a ConfigError naming the variable
    (never its value)."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    problems = []
    for var in sorted(environ):
        if not var.startswith(HEADER_PREFIX):
            continue
        raw = var[len(HEADER_PREFIX):]
        name = "-".join(part.capitalize() for part in raw.split("_"))
        value = environ[var]
        if not raw or not _TOKEN.match(name):
            problems.append(Problem("", f"${var}", "not a header name: use letters, digits "
                                    "and underscores after ORCHESTRATE_HTTP_HEADER_"))
        elif any(ch in value for ch in "\r\n\x00"):
            problems.append(Problem("", f"${var}", "its value holds a line break, which a "
                                    "header cannot carry"))
        else:
            out[name] = value
    if problems:
        raise ConfigError(problems)
    return out


def publish(run: RunDoc, url: str, sent: dict[str, str], timeout_s: float = 30.0,
            environ: Mapping[str, str] | None = None) -> Counts:
    """POST each cell of ``run`` not in ``sent`` with its fingerprint; ``sent`` (cell id ->
    fingerprint received) is updated as each is received. PublishError in one line at the
    first failure (with what was sent before it)."""
    headers = headers_from_env(environ)
    scrub = Scrubber(headers.values())
    counts = Counts()
    for cell in run.cells:
        before = sent.get(cell.cell_id)
        if before == cell.fingerprint:
            counts.unchanged += 1
            continue
        body = {**cell.document, "fingerprint": cell.fingerprint}
        if before:
            body["replaces"] = before
        try:
            post(url, body, headers, timeout_s)
        except PublishError as exc:
            message = scrub(str(exc).encode()).decode("utf-8", "replace")
            raise PublishError(f"{message} (at cell {cell.cell_id})", counts) from None
        sent[cell.cell_id] = cell.fingerprint
        if before:
            counts.replaced += 1
        else:
            counts.new += 1
    return counts


def post(url: str, document: Mapping[str, Any], headers: Mapping[str, str],
         timeout_s: float) -> None:
    """One POST of a JSON document; PublishError in one line unless the answer is 2xx."""
    data = json.dumps(document, allow_nan=False, default=str).encode()
    request = urllib.request.Request(
        url, data=data, method="POST",
        headers={**headers, "Content-Type": "application/json",
                 "User-Agent": "orchestrate-publish"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # http(s) only
            response.read(65536)
    except urllib.error.HTTPError as exc:
        body = exc.read(2048).decode("utf-8", "replace") if exc.fp else ""
        line = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
        raise PublishError(f"the collector refused: HTTP {exc.code} {exc.reason}"
                           + (f": {line[:200]}" if line else "")) from None
    except TimeoutError:
        raise PublishError(f"no answer within {timeout_s:g} s (the collector is slow or "
                           "unreachable; --timeout S waits longer)") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise PublishError(f"no answer within {timeout_s:g} s (the collector is slow or "
                               "unreachable; --timeout S waits longer)") from None
        if isinstance(reason, ConnectionRefusedError):
            raise PublishError("cannot connect: connection refused (is the collector "
                               "running?)") from None
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        raise PublishError(f"cannot connect: {text}") from None
    except (ConnectionError, OSError) as exc:  # reset or closed while answering
        raise PublishError(f"the connection failed: {exc.strerror or exc}") from None
