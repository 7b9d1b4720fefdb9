"""What a publish did to one target, and the error when it could not."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import OrchestratorError


@dataclass
class Counts:
    """What one publish did to a target: cells sent for the first time, sent again to replace
    what the target had (their data changed), left alone (the target has them as they are)."""

    new: int = 0
    replaced: int = 0
    unchanged: int = 0
    #: Extra copies of a cell found on the target (two publishes at once) and removed.
    duplicates_removed: int = 0
    #: Where to look (the MLflow UI's page of the sweep).
    link: str = ""

    @property
    def sent(self) -> int:
        return self.new + self.replaced

    def words(self) -> str:
        """``8 cells: 2 new, 1 replaced (re-run), 5 unchanged``."""
        total = self.new + self.replaced + self.unchanged
        parts = [f"{n} {what}" for n, what in ((self.new, "new"),
                                               (self.replaced, "replaced"),
                                               (self.unchanged, "unchanged")) if n]
        extra = (f", {self.duplicates_removed} duplicate(s) removed"
                 if self.duplicates_removed else "")
        return f"{total} cell{'' if total == 1 else 's'}: {', '.join(parts) or 'none'}{extra}"


class PublishError(OrchestratorError):
    """A publish could not be done: the client is missing, the target is down, slow or
    refuses. The message is one line; the run folder is unchanged; ``counts``: what was done
    before it stopped (a repeat goes on from there)."""

    def __init__(self, message: str, counts: Counts | None = None) -> None:
        super().__init__(message)
        self.counts = counts or Counts()
