"""Record what a real Docker engine says while it pulls an image: the events docker-py's
``APIClient.pull(..., stream=True, decode=True)`` yields, each with the seconds since the pull
began, one JSON object a line. ``tests/data/docker-pull/`` holds what this recorded; the
progress display (orchestrator/images/pulls.py, the CLI's bars and lines) is tested on them.

    python tests/tools/capture_docker_pull.py OUT.jsonl [--rate BYTES_PER_S] [--mb 8,16,4]
        [--more-mb 12]

The image: ``FROM scratch`` and one layer per ``--mb`` of random bytes (gzip cannot shrink
them), built on this machine's engine, saved (``docker save``), removed, and pulled back from
the registry stand-in on loopback (tests/infra/registry_standin.py; the project's machines
reach no registry), which sends at most ``--rate`` bytes per second. A second pull of the same
reference, the image now there, is recorded after it (``"pull": 2``): what a pull of an image
that is up to date says; with ``--more-mb``, a third: an image built on the first with more
layers (its first layers ``Already exists``). Needs a Docker engine
(tests/infra/start-dockerd.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry_support import pullable


def record(api: Any, ref: str) -> list[dict[str, Any]]:
    """The events of one pull of ``ref``, each with its time (``t``: seconds since it began)."""
    repository, _, tag = ref.rpartition(":")
    start = time.monotonic()
    return [{"t": round(time.monotonic() - start, 4), "event": event}
            for event in api.pull(repository, tag=tag, stream=True, decode=True)]


def main(argv: list[str] | None = None) -> int:
    import docker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rate", type=float, default=12e6)
    parser.add_argument("--mb", default="8,16,4")
    parser.add_argument("--more-mb", default="", help="a second image on the first: its layers")
    args = parser.parse_args(argv)
    client = docker.from_env()
    sizes = [float(x) for x in args.mb.split(",")]
    more = [float(x) for x in args.more_mb.split(",") if x]
    with pullable(client, sizes, args.rate, more) as refs:
        pulls = [record(client.api, refs[0]), record(client.api, refs[0])]
        pulls += [record(client.api, ref) for ref in refs[1:]]
    version = client.version()
    head = {"engine": version.get("Version"), "api": version.get("ApiVersion"),
            "docker-py": docker.__version__, "layers_mb": sizes, "more_layers_mb": more,
            "rate": args.rate, "registry": "tests/infra/registry_standin.py on loopback",
            "pulls": ["the image", "the same again (up to date)",
                      "an image on it with more layers"][:len(pulls)]}
    lines = [json.dumps({"recorded": head})]
    lines += [json.dumps({"pull": n, **e}) for n, events in enumerate(pulls, start=1)
              for e in events]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {' + '.join(str(len(p)) for p in pulls)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
