"""Every error the testbed raises on purpose, and the exit status each means.

The command line turns them into one line on stderr and an exit status:

====================  ======  ==================================================
class                 status  meaning
====================  ======  ==================================================
``BadInput``          2       the user's input is wrong; nothing was created
``MissingFeature``    3       the machine lacks what the scenario needs
``RunFailed``         1       the run started and could not finish
====================  ======  ==================================================

Each module's own error subclasses one of these (``ScenarioError(BadInput)``,
``NetdevError(RunFailed)``...), so a caller catches by meaning and the command line
needs no list of every module's exceptions. The builtin base each had before stays
beside it (a ``ScenarioError`` is still a ``ValueError``).
"""
from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class IncastError(Exception):
    """The root: an error of ours, with its exit status and the words that lead its line."""
    exit_code = EXIT_FAILED
    label = "run failed: "


class BadInput(IncastError, ValueError):
    """Bad input: one line naming what is wrong and what is allowed; nothing created."""
    exit_code = EXIT_USAGE
    label = ""


class MissingFeature(IncastError, RuntimeError):
    """The machine cannot run what the scenario asks for."""
    exit_code = EXIT_MISSING
    label = "missing: "


class RunFailed(IncastError, RuntimeError):
    """A run (or a tool it drives) failed after it started."""


class ScenarioError(BadInput):
    """A bad scenario: one line naming the field and what is allowed."""


class UsageError(BadInput):
    """Bad command-line arguments."""


class ResultsExist(BadInput, FileExistsError):
    """The results location is taken."""


class OutputUnusable(BadInput, OSError):
    """The output location cannot be written (a file in the way, no permission)."""
