"""Base-image pulls as the CLI shows them (:class:`PullBars`): on a terminal, a rich progress bar
per pull (bytes downloaded of the layers' bytes, then layers, rate and time left:
:meth:`orchestrator.images.pulls.PullProgress.text`), as the sweep's own progress is drawn;
elsewhere (a pipe, cron) a line every few seconds. Either way a last line says what the pull
took, or why it failed. A build's ``on_log`` that is (or is a method of) an object with
``pull_progress`` gets the pull's every update (:func:`orchestrator.images.pulls.watcher_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.images.pulls import LINE_EVERY_S

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from orchestrator.images.pulls import PullProgress


class PullBars:
    """Pulls drawn on ``console``: bars on a terminal, lines every ``every_s`` seconds
    elsewhere. ``pause``: a live display of the caller's (a ``console.status`` spinner) that
    gives way while a bar is drawn (rich draws one live display at a time)."""

    def __init__(self, console: Console, pause: Any = None,
                 every_s: float = LINE_EVERY_S) -> None:
        self.console = console
        self.pause = pause
        self.every_s = every_s
        self.bars: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self._said: dict[str, float] = {}

    def pull_progress(self, progress: PullProgress) -> None:
        """Draw one update of a pull (:class:`~orchestrator.images.pulls.PullReport` calls
        it on every event of the engine's stream, and when it ends)."""
        if not self.console.is_terminal:
            self._line(progress)
        elif progress.finished:
            self._done(progress)
        else:
            self._bar(progress)

    def due(self, progress: PullProgress) -> bool:
        """Whether a line of ``progress`` is due (its first, its last, or ``every_s`` since
        the one before); counts it said."""
        said = self._said.get(progress.ref)
        if progress.finished or said is None or progress.now - said >= self.every_s:
            self._said[progress.ref] = progress.now
            return True
        return False

    def _line(self, progress: PullProgress) -> None:
        first = progress.ref not in self._said
        if self.due(progress):
            self._print(f"pulling base image {progress.ref}" if first and not progress.finished
                        else progress.line(), progress)

    def _bar(self, progress: PullProgress) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        if self.bars is None:
            if self.pause is not None:
                self.pause.stop()
            self.bars = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 BarColumn(), TextColumn("{task.fields[detail]}"),
                                 console=self.console, transient=True)
            self.bars.start()
        task = self.tasks.get(progress.ref)
        if task is None:
            task = self.tasks[progress.ref] = self.bars.add_task(
                _escape(f"pull {progress.ref}"), total=None, detail="")
        self.bars.update(task, total=progress.to_download or None,
                         completed=progress.downloaded, detail=_escape(progress.text()))

    def _done(self, progress: PullProgress) -> None:
        task = self.tasks.pop(progress.ref, None)
        if self.bars is not None:
            if task is not None:
                self.bars.remove_task(task)
            if not self.tasks:
                self.bars.stop()
                self.bars = None
                if self.pause is not None:
                    self.pause.start()
        self._print(progress.line(), progress)

    def _print(self, text: str, progress: PullProgress) -> None:
        self.console.print(text, style="red" if progress.failed else "dim", markup=False,
                           highlight=False, soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
