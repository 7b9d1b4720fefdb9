"""``orchestrate import``: existing logs become a run of a matrix (see
orchestrator.results.importer)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli import options
from orchestrator.config.defaults import results_root

if TYPE_CHECKING:
    from orchestrator.results.importer import ImportPlan

#: orchestrator.config.matrix_file.TableRuleName, spelled out so that parsing the command line
#: imports no pydantic (tests/test_seeds.py keeps the two equal).
RULE_CHOICES = ("median", "dlperf", "dle", "tbd", "per-gpu", "habana")

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import", help="turn existing logs (DLLogger, DLPerf-style folders, runs copied from "
        "elsewhere) into a run of a matrix",
        description="Read DLLogger raports or stdout logs, a folder of logs named "
        "<arch>_<precision>_bs<batch>_g<gpus>[_r<repeat>].log or laid out as DLPerf's "
        "(<nodes>n<gpus>g/<model>_b<batch>_<precision>_<run>.log), the seeds' own formats "
        "(Nsight Compute CSV, TensorFlow TimeHistory lines, seed 002's per-GPU iteration logs, "
        "Habana train.py logs), or a run folder of ours, and write them as a run of --matrix "
        "under RESULTS/<matrix>/<run id>/, so report and history show them. Parameters come "
        "from the log (DLE's PARAMETER record), the file name and --param; they pick the "
        "matrix's cell group.",
    )
    p.add_argument("sources", nargs="+", type=Path, metavar="SOURCE",
                   help="log or raport files, a folder of logs, or one run folder")
    options.matrix(p, "the matrix whose history the run joins: a matrix file, or a name (its "
                   "file under ./matrices/ where there is one, else its runs' configurations); "
                   "default for a run folder: its own", metavar="NAME|MATRIX.toml")
    options.set_fields(p, "set a field of the --matrix file, as `matrix --set` does "
                       "(repeatable; KEY=VALUE as there): join the configuration a sweep with "
                       "these --set runs")
    options.results(p)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a cell parameter of every imported log, e.g. hardware=v100 "
                   "(repeatable; wins over the log and the file name)")
    p.add_argument("--pattern", metavar="REGEX",
                   help="file naming rule for folders: named groups are parameters or repeat "
                   "(default: <arch>_<precision>_bs<batch>_g<gpus>[_r<repeat>].log)")
    p.add_argument("--figures", type=Path, metavar="FILE.toml",
                   help="a [figures] table as in a matrix: parser, regex figures, bounds")
    p.add_argument("--warmup", type=int, metavar="N",
                   help="DLLogger: iterations dropped before recomputing (default: the "
                   "matched cell's warmup)")
    p.add_argument("--stack", action="append", default=[], metavar="FIELD=VALUE",
                   help="the stack the logs ran on, where they do not state it (repeatable: "
                   "torch, cuda, cudnn, driver, gpu, host, python, image, image_id); history "
                   "compares it with the sweeps' as it compares theirs")
    p.add_argument("--run-id", help="the new run's id (default: from the logs' first time)")
    p.add_argument("--table-rule", choices=RULE_CHOICES, metavar="RULE",
                   help="the table rule of a matrix written from the logs: "
                   f"{', '.join(RULE_CHOICES)} (default: the logs' format's own, e.g. dlperf "
                   "for DLPerf's layout; median otherwise)")
    p.add_argument("--device", choices=("cuda", "hpu", "cpu"), default="cuda",
                   help="device of the hardware profiles of a new matrix (default: cuda)")
    p.add_argument("--allow-partial", action="store_true",
                   help="import logs that end without their run summary (crashed runs)")
    options.dry_run(p, "show what would be imported")
    options.no_publish(p, "the imported run")
    p.set_defaults(handler=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from orchestrator.config.overrides import redact_argv
    from orchestrator.errors import ConfigError
    from orchestrator.results.importer import ImportOptions, plan_import, write_import

    explicit_results = args.results
    args.results = results_root(args.results)

    figures = None
    if args.figures is not None:
        from orchestrator.results.figures.figure_parsers import load_figures_file

        figures = load_figures_file(args.figures)
    if args.warmup is not None and args.warmup < 0:
        raise ConfigError("must be 0 or more", field="--warmup")
    options = ImportOptions(
        matrix=args.matrix, results_root=args.results, params=args.param, pattern=args.pattern,
        figures=figures, warmup=args.warmup, run_id=args.run_id,
        allow_partial=args.allow_partial, device=args.device, argv=redact_argv(sys.argv),
        table_rule=args.table_rule, stack=args.stack, overrides=args.overrides,
    )
    plan = plan_import(args.sources, options)
    out = _Lines()
    for line in _mapping_lines(plan):
        out.say(line)
    if args.dry_run:
        out.say(f"dry run: would write {args.results}/{plan.target.name}/{plan.run_id}/")
        return out.status()
    paths = write_import(plan, options)
    out.say(f"{paths.root}\n{paths.summary_txt.read_text(encoding='utf-8').rstrip()}")
    from orchestrator.cli.publish_commands import after_run

    after_run(paths, explicit_results, skip=args.no_publish)
    return out.status()


class _Lines:
    """The import's own output. A reader that stops reading (``| head -1``) must not stop the
    import half way: what cannot be written goes unsaid, the import is written whole, and the
    command then ends with the broken pipe's status (141), as every command."""

    def __init__(self) -> None:
        self.broken = False

    def say(self, text: str) -> None:
        if self.broken:
            return
        try:
            print(text, flush=True)
        except BrokenPipeError:
            self.broken = True

    def status(self) -> int:
        if self.broken:
            raise BrokenPipeError  # the CLI's answer to a closed pipe: quiet, exit 141
        return 0


def _mapping_lines(plan: ImportPlan) -> list[str]:
    lines = [f"matrix {plan.target.name} ({plan.target.source}), run {plan.run_id}"]
    if plan.run_folder is not None:
        for cell in plan.run_folder.cells:
            moved = f" -> {cell.new_id}" if cell.new_id != cell.old_id else ""
            lines.append(f"  {cell.old_id}{moved}")
    for entry in plan.entries:
        state = "ok" if entry.evaluation and entry.evaluation.ok else \
            f"FAILED: {entry.evaluation.reason if entry.evaluation else ''}"
        lines.append(f"  {entry.label} -> {entry.cell_id} ({entry.kind}, {state})")
    for path in plan.skipped:
        why = "" if path.endswith("(a symbolic link, not followed)") else \
            " (name does not match the naming rule)"
        lines.append(f"  skipped{why}: {path}")
    return lines
