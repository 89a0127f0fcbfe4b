"""Which stacks a command works on: a matrix file narrowed by ``--cuda``/``--target``/``--only`` and a shard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.data import resolve_matrix_path
from stackforge.core.errors import SpecError
from stackforge.core.model import Stack
from stackforge.core.shard import Shard, select
from stackforge.plan.planner import Plan, plan_file
from stackforge.plan.user_compat import UserCompat


@dataclass(frozen=True, slots=True)
class StackSelection:
    """A matrix and the narrowing the command line asked for (``shard`` None: every kept stack).

    ``matrix`` is the ``--matrix`` value: a path, a shipped matrix's name, or None for the default.
    """

    matrix: str | None = None
    targets: tuple[str, ...] = ()
    cuda: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    shard: Shard | None = None
    user_compat: UserCompat | None = None
    max_cells: int | None = None        # None: the planner's cap (``--max-cells``)

    @property
    def matrix_path(self) -> Path:
        """The matrix file the ``--matrix`` value names."""
        return resolve_matrix_path(self.matrix)

    @property
    def shard_text(self) -> str | None:
        """``K/N`` as a run folder records it, or None."""
        return str(self.shard) if self.shard else None

    def plan(self) -> Plan:
        """The plan of the matrix with the shipped knowledge (and the user's on top)."""
        return plan_file(self.matrix_path, targets=self.targets, cuda=self.cuda, only=self.only,
                         user_compat=self.user_compat, max_cells=self.max_cells)

    def stacks(self, plan: Plan) -> tuple[Stack, ...]:
        """The plan's kept stacks this shard draws."""
        return select(plan.kept_stacks(), self.shard)


def cells_to_build(selection: StackSelection) -> list[tuple[Stack, Any]]:
    """(stack, derived) for every kept stack of the selection, in matrix order (``render``, ``build``).

    Raises:
        SpecError: the selection keeps no stack at all.
    """
    plan = selection.plan()
    kept = plan.kept_stacks()
    if not kept:
        raise SpecError("no stack to build: the selection is empty or every stack was pruned",
                        remedy="see `stackforge plan` for the reasons")
    # A shard that draws none of the kept stacks is not an error: a fixed --shard K/N fan-out in CI
    # must not fail the jobs that the hash left empty.
    return [(stack, plan.cells_for(stack)[0].derived) for stack in select(kept, selection.shard)]
