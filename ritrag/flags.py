"""Command-line flags from dataclass fields: the one way ritrag defines a flag.

A flag is a field of the dataclass its value configures, so that its default,
type, choices and help cannot drift from the field's. The field's metadata
says how it is a flag (`option` writes it):

    help             the flag's help (required: no flag goes undocumented)
    flag             the flag's name, where it is not the field's
    choices          the values the flag takes; on a bool field, its two words,
                     the true one first (("on", "off"), ("llm", "off"))
    type             the flag's value type, where the annotation does not say one
    positional       True: a positional argument, not a --flag
    short            a one-letter alias ("v": -v), listed before the flag
    metavar          the value's name in --help, where it is not the flag's
    cli              False: the field is no flag
    default_in_help  the flag's default is None (left out, the field's default
                     applies) and the help states the default in its own words:
                     "{default}" in it is the field's default, as the flag writes it
    to_field/to_flag converters between the flag's value and the field's

The rest comes from the annotation: `int | None` is an int flag, a
`Literal[...]` takes its values, a `tuple[str, ...]` is repeatable, a bool
without choices a switch (store_true). A positional `tuple[str, ...]` takes
the words that follow: one or more, or any number when the field has a
default. `add_arguments` adds a dataclass's flags to anything with argparse's
`add_argument` (a parser, a group, Beam's `_add_argparse_args` parser), and
`added_flag` says which flag made an argparse action (a test checks that every
argument of the CLI is a field's); `from_arguments` reads the parsed values
back into the dataclass. Standard library only: the serving commands, the jobs
and the core all use it.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
import weakref
from typing import Any, Callable, Iterable, Literal, Mapping

_METADATA_KEYS = {"help", "flag", "choices", "type", "positional", "short", "metavar", "cli", "default_in_help",
                  "to_field", "to_flag"}


def option(default: Any = dataclasses.MISSING, help: str = "", **metadata: Any) -> Any:
    """A dataclass field that is a flag: its default and its metadata (above)."""
    unknown = set(metadata) - _METADATA_KEYS
    if unknown:
        raise TypeError(f"unknown flag metadata: {sorted(unknown)}")
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Flag:
    """One field's flag, as its metadata and annotation define it."""

    field: str  # the field's name
    name: str  # the flag's name (its argparse dest)
    help: str
    type: Callable[[str], Any] | None  # None: the value is the string given
    choices: tuple[Any, ...] | None
    default: Any  # the flag's default, as the flag writes it
    words: tuple[str, str] | None = None  # a bool field's (true word, false word)
    switch: bool = False  # a bool field without words: store_true
    repeatable: bool = False  # a tuple field: the flag repeats, each value appended
    positional: bool = False
    nargs: str | None = None  # a repeatable positional's: "+" (one or more) or "*" (any number)
    short: str | None = None  # the one-letter alias
    metavar: str | None = None
    default_in_help: bool = False
    to_field: Callable[[Any], Any] = _same
    to_flag: Callable[[Any], Any] = _same

    @classmethod
    def of(cls, f: dataclasses.Field, annotation: Any) -> "Flag":
        meta = f.metadata
        if not meta.get("help"):
            raise ValueError(f"field {f.name}: a flag needs its help (metadata 'help', or 'cli': False)")
        value = f.default if f.default is not dataclasses.MISSING else None
        if annotation is Any and value is not None:
            annotation = tuple[Any, ...] if isinstance(value, tuple) else type(value)
        kind, repeatable = _flag_type(annotation)
        choices = meta.get("choices")
        if choices is None and typing.get_origin(kind) is Literal:
            choices = typing.get_args(kind)
        if typing.get_origin(kind) is Literal:
            kind = type(choices[0])
        kind = meta.get("type", kind)
        to_field, to_flag = meta.get("to_field", _same), meta.get("to_flag", _same)
        words = switch = None
        if kind is bool:
            if choices:  # a bool written as one of two words
                words = (choices[0], choices[1])
                to_field, to_flag = words[0].__eq__, lambda on: words[0] if on else words[1]
            else:
                switch = True
            kind = None
        elif kind is str or kind is Any:
            kind = None  # argparse's default: the string given
        default = None if meta.get("default_in_help") or value is None else to_flag(value)
        if repeatable:
            default = [to_flag(item) for item in value or ()]
        text = meta["help"].format(default=to_flag(value)) if meta.get("default_in_help") else meta["help"]
        positional = bool(meta.get("positional"))
        nargs = ("+" if f.default is dataclasses.MISSING else "*") if positional and repeatable else None
        return cls(field=f.name, name=meta.get("flag", f.name), help=text, type=kind,
                   choices=tuple(choices) if choices else None, default=False if switch else default,
                   words=words, switch=bool(switch), repeatable=repeatable, positional=positional, nargs=nargs,
                   short=meta.get("short"), metavar=meta.get("metavar"),
                   default_in_help=bool(meta.get("default_in_help")), to_field=to_field, to_flag=to_flag)

    def add_to(self, parser: Any, *, default: Any = dataclasses.MISSING, required: bool = False,
               help: str | None = None) -> Any:
        """Add the flag to `parser` (anything with argparse's add_argument);
        `default`, `required`, `help`: a command's own. Returns what add_argument returned."""
        kwargs: dict[str, Any] = {"help": self.help if help is None else help}
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.positional:
            if self.nargs is not None:
                kwargs["nargs"] = self.nargs
            return self._made(parser.add_argument(self.name, **kwargs))
        kwargs["default"] = self.default if default is dataclasses.MISSING else default
        if required:
            kwargs["required"] = True
        if self.switch:
            kwargs["action"] = "store_true"
        else:
            if self.repeatable:
                kwargs["action"] = "append"
            if self.type is not None:
                kwargs["type"] = self.type
            if self.choices is not None:
                kwargs["choices"] = self.choices
        names = (f"-{self.short}", f"--{self.name}") if self.short else (f"--{self.name}",)
        return self._made(parser.add_argument(*names, **kwargs))

    def _made(self, action: Any) -> Any:
        """`action`, the argparse action this flag made (None where a parser
        took no action back, e.g. a flag it leaves out), remembered as this flag's."""
        if action is not None:
            _MADE[action] = self
        return action

    def field_value(self, flag_value: Any) -> Any:
        """The field's value of the flag's value `flag_value` (as parsed)."""
        if self.repeatable:
            return tuple(self.to_field(item) for item in flag_value or ())
        return None if flag_value is None else self.to_field(flag_value)


# The argparse actions the flags made, and by which flag: held only as long as their parser.
_MADE: weakref.WeakKeyDictionary[Any, Flag] = weakref.WeakKeyDictionary()


def added_flag(action: Any) -> Flag | None:
    """The flag that made argparse action `action`; None for an action added
    otherwise (argparse's --help, a raw add_argument, Beam's own options)."""
    return _MADE.get(action)


def _flag_type(annotation: Any) -> tuple[Any, bool]:
    """(the value type of a field annotated `annotation`, whether it repeats):
    `X | None` is X's, `tuple[X, ...]` repeats X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = inner[0] if len(inner) == 1 else Any
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        return (args[0] if len(args) == 2 and args[1] is Ellipsis else Any), True
    return annotation, False


@functools.lru_cache(maxsize=None)
def flags_of(cls: type) -> dict[str, Flag]:
    """The flags of dataclass `cls`'s fields (those not marked cli False), by field name, in field order."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError:  # an annotation only a type checker resolves: the defaults' types say it
        hints = {}
    return {f.name: Flag.of(f, hints.get(f.name, Any)) for f in dataclasses.fields(cls)
            if f.metadata.get("cli", True) is not False}


def add_arguments(parser: Any, cls: type, *, only: Iterable[str] | None = None, skip: Iterable[str] = (),
                  defaults: Mapping[str, Any] | None = None, required: Iterable[str] = (),
                  help_notes: Mapping[str, str] | None = None) -> list[Any]:
    """Add dataclass `cls`'s flags to `parser`, in field order. By field name:
    `only` these (None: all), less `skip`; `defaults`: a command's own
    defaults (as the flag writes them); `required`: flags a command must be
    given; `help_notes`: text appended to a flag's help. Returns the actions
    added (what `parser.add_argument` returned)."""
    defaults, notes, required = dict(defaults or {}), dict(help_notes or {}), set(required)
    wanted = None if only is None else set(only)
    return [flag.add_to(parser, default=defaults.get(name, dataclasses.MISSING), required=name in required,
                        help=flag.help + notes.get(name, ""))
            for name, flag in flags_of(cls).items()
            if (wanted is None or name in wanted) and name not in set(skip)]


def flag_values(cls: type, namespace: Any) -> dict[str, Any]:
    """The field values of dataclass `cls` that `namespace` (an argparse
    Namespace, a Beam options view) holds for its flags, by field name; a flag
    it lacks, and a default_in_help flag left out, are left out."""
    values = {}
    for name, flag in flags_of(cls).items():
        if not hasattr(namespace, flag.name):
            continue
        given = getattr(namespace, flag.name)
        if given is None and flag.default_in_help:
            continue
        values[name] = flag.field_value(given)
    return values


def from_arguments(cls: type, namespace: Any, **values: Any) -> Any:
    """Dataclass `cls` from its flags' values in `namespace` (see
    `flag_values`); `values`: the fields that are no flags, or overrides."""
    return cls(**{**flag_values(cls, namespace), **values})

