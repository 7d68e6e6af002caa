"""The jobs' command lines: ritrag's flags checked by ritrag, Beam's passed to Beam.

Each flag is defined once, by a `PipelineOptions` class's `_add_argparse_args`
(Beam gathers the flags of the direct subclasses of PipelineOptions to ship
them to workers). A job names the classes it reads in a `JobFlags` mapping;
from that one definition come the job's argument check (`parse_job_options`,
what `run(argv)` calls), the CLI's `--help` (`add_job_arguments`) and the
flags the CLI and the refresh hand to a job (`job_flags`).

Beam itself only warns about a flag it does not know, so a mistyped
`--site_dept 1` used to build another index and exit 0. Here every flag must
be ritrag's (for this job) or one of Beam's own options (`--runner`,
`--project`, `--temp_location`, `--direct_num_workers`, `--resource_hints`, ...);
anything after a lone `--` goes to Beam unchecked (options of a runner or
plugin this process does not know).
"""
from __future__ import annotations

import argparse
import difflib
import sys
from typing import Iterable, Mapping, Sequence

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

# A job's flags: option class -> the names of its flags the job reads (None: all).
JobFlags = Mapping[type[PipelineOptions], "tuple[str, ...] | None"]

BEAM_OPTIONS_HELP = (
    "Beam options: any of Beam's own pipeline options is passed to the runner, e.g. --runner "
    "DataflowRunner|FlinkRunner|SparkRunner|PortableRunner, --project, --region, --temp_location, "
    "--setup_file ./setup.py, --direct_num_workers N --direct_running_mode multi_processing, "
    "--resource_hints; the whole list: https://beam.apache.org/releases/pydoc/current/"
    "apache_beam.options.pipeline_options.html (infra/README.md shows runner invocations). "
    "Flags after a lone -- go to Beam unchecked.")


class JobOptionsError(ValueError):
    """A job's command line names a flag that is neither ritrag's nor Beam's, or
    gives a ritrag flag a value it refuses."""


class _Refusing(_BeamArgumentParser):
    """Errors raise JobOptionsError instead of exiting (run(argv) is a Python API)."""

    def error(self, message: str):  # argparse's hook; Beam's parser swallows "ambiguous option"
        raise JobOptionsError(message)


class _Selected:
    """A parser (or group) that takes only the named flags of an option class."""

    def __init__(self, target, names: Iterable[str] | None, skip: Iterable[str] = ()):
        self._target, self._names, self._skip = target, None if names is None else set(names), set(skip)
        self.actions: list[argparse.Action] = []

    def add_argument(self, *flags: str, **kwargs) -> argparse.Action | None:
        """The action added, as argparse returns it (ritrag.flags records it); None for a flag left out."""
        name = flags[0].lstrip("-")
        if (self._names is None or name in self._names) and name not in self._skip:
            self.actions.append(self._target.add_argument(*flags, **kwargs))
            return self.actions[-1]
        return None


def add_job_arguments(parser: argparse.ArgumentParser, flags: JobFlags, skip: Iterable[str] = ()
                      ) -> list[argparse.Action]:
    """Add the job's ritrag flags to `parser`, one help group per option class
    (titled by its docstring's first line); `skip`: flags the caller defines
    itself (a positional input). Returns the actions added."""
    actions = []
    for cls, names in flags.items():
        title = " ".join((cls.__doc__ or cls.__name__).split()).split(". ")[0].rstrip(".")
        selected = _Selected(parser.add_argument_group(title), names, skip)
        cls._add_argparse_args(selected)  # the one definition of these flags
        actions += selected.actions
    return actions


def job_actions(flags: JobFlags) -> list[argparse.Action]:
    """The argparse actions of a job's ritrag flags (what `job_flags` writes back)."""
    return add_job_arguments(argparse.ArgumentParser(add_help=False), flags)


def merge_flags(*specs: JobFlags, without: Iterable[str] = ()) -> JobFlags:
    """The flags of several jobs as one mapping (a command line that feeds them
    all, like the refresh's), less the flags named in `without`."""
    names: dict[type[PipelineOptions], set[str]] = {}
    for spec in specs:
        for cls, selected in spec.items():
            every = {a.dest for a in job_actions({cls: None})}
            names.setdefault(cls, set()).update(every if selected is None else selected)
    return {cls: tuple(sorted(n - set(without))) for cls, n in names.items()}


def _beam_parser() -> argparse.ArgumentParser:
    parser = _Refusing(allow_abbrev=False, add_help=False)
    # Beam's get_all_options gathers the same classes: the direct subclasses of PipelineOptions.
    for cls in {c.__module__ + c.__qualname__: c for c in PipelineOptions.__subclasses__()
                if c.__module__.startswith("apache_beam.")}.values():
        cls._add_argparse_args(parser)
    return parser


def check_job_argv(argv: Sequence[str], flags: JobFlags) -> tuple[argparse.Namespace, list[str]]:
    """(ritrag's flags parsed, Beam's flags as given) of a job's command line;
    JobOptionsError names an unknown flag and the closest known one."""
    argv = list(argv)
    unchecked = []
    if "--" in argv:
        argv, unchecked = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    ours = _Refusing(allow_abbrev=False, add_help=False)
    add_job_arguments(ours, flags)
    namespace, rest = ours.parse_known_args(argv)
    beam = _beam_parser()
    _, unknown = beam.parse_known_args(rest)
    if unknown:
        raise JobOptionsError(_unknown_message(unknown, [*_option_strings(ours), *_option_strings(beam)]))
    return namespace, [*rest, *unchecked]


def parse_job_options(argv: Sequence[str] | None, flags: JobFlags) -> PipelineOptions:
    """The PipelineOptions of a job's command line (None: this process's, as
    Beam reads it), after `check_job_argv`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    check_job_argv(argv, flags)
    return PipelineOptions([a for a in argv if a != "--"])


def given_flags(argv: Sequence[str], flags: JobFlags) -> dict[str, object]:
    """The ritrag flags `argv` gives explicitly, by name, with their values (an
    update tells a flag given with its default value from one left out)."""
    parser = _Refusing(allow_abbrev=False, add_help=False)
    for action in add_job_arguments(parser, flags):
        action.default = argparse.SUPPRESS
    argv = list(argv)
    return vars(parser.parse_known_args(argv[:argv.index("--")] if "--" in argv else argv)[0])


def job_flags(namespace: argparse.Namespace, actions: Iterable[argparse.Action]) -> list[str]:
    """The command line that gives a job the values `namespace` holds for
    `actions` (the values that differ from their default: the job has the same
    defaults, from the same definition)."""
    argv = []
    for action in actions:
        value = getattr(namespace, action.dest, action.default)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            argv += [x for item in value for x in (flag, str(item))]
        else:
            argv += [flag, str(value)]
    return argv


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings]


def _unknown_message(unknown: list[str], known: list[str]) -> str:
    flag = next((u for u in unknown if u.startswith("-")), None)
    if flag is None:
        return f"unexpected argument {unknown[0]!r}"
    name = flag.split("=", 1)[0]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"unknown option {name}" + (f"; did you mean {close[0]}?" if close else "")
