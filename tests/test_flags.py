"""ritrag/flags.py: a dataclass's fields as argparse flags, and the parsed
flags read back into the dataclass."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Literal

import pytest

from ritrag.flags import add_arguments, added_flag, flag_values, flags_of, from_arguments, option


@dataclasses.dataclass(frozen=True)
class Example:
    source: str = option(help="where to read", positional=True)
    size: int = option(3, "how many")
    ratio: float | None = option(None, "a share (default: chosen)")
    mode: Literal["fast", "slow"] = option("fast", "how")
    hard: bool = option(True, "hard or soft", choices=("on", "off"))
    loud: bool = option(False, "log more")
    tag: tuple[str, ...] = option((), "a tag (repeatable)")
    label: str = option("x", "a label", flag="example_label")
    text: str = option("a\nz", "a text; \\n writes a newline (default '{default}')", default_in_help=True,
                       to_field=lambda text: text.replace("\\n", "\n"),
                       to_flag=lambda text: text.replace("\n", "\\n"))
    internal: int = dataclasses.field(default=7, metadata={"cli": False})


def parser(**kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, Example, **kwargs)
    return p


def test_a_dataclass_round_trips_through_argparse():
    assert from_arguments(Example, parser().parse_args(["here"])) == Example("here")
    given = parser().parse_args(["here", "--size", "5", "--ratio", "0.5", "--mode", "slow", "--hard", "off",
                                 "--loud", "--tag", "a", "--tag", "b", "--example_label", "y", "--text", "a\\nb"])
    assert from_arguments(Example, given, internal=8) == Example(
        "here", size=5, ratio=0.5, mode="slow", hard=False, loud=True, tag=("a", "b"), label="y", text="a\nb",
        internal=8)


def test_the_flags_defaults_types_and_help_are_the_fields():
    actions = {a.dest: a for a in parser()._actions}
    assert actions["size"].default == 3 and actions["size"].type is int
    assert actions["ratio"].default is None and actions["ratio"].type is float  # from `float | None`
    assert actions["mode"].choices == ("fast", "slow")  # from the Literal
    assert actions["hard"].default == "on" and actions["hard"].choices == ("on", "off")
    assert isinstance(actions["loud"], argparse._StoreTrueAction)
    assert actions["example_label"].help == "a label" and "label" not in actions
    assert actions["text"].default is None  # default_in_help: left out, the field's default applies
    assert actions["text"].help == "a text; \\n writes a newline (default 'a\\nz')"  # as the flag writes it
    assert actions["source"].option_strings == []  # positional


def test_choices_are_refused():
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser().parse_args(["here", "--mode", "medium"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser().parse_args(["here", "--hard", "yes"])


def test_repeatable_tuples():
    args = parser().parse_args(["here"])
    assert args.tag == [] and from_arguments(Example, args).tag == ()
    assert from_arguments(Example, parser().parse_args(["here", "--tag", "a"])).tag == ("a",)


def test_a_field_marked_cli_false_is_no_flag():
    assert "internal" not in flags_of(Example)
    with pytest.raises(SystemExit):
        parser().parse_args(["here", "--internal", "1"])


def test_a_command_picks_flags_and_sets_its_own_defaults_required_and_notes():
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, Example, only=("size", "label", "tag"), skip=("tag",), defaults={"size": 9},
                  required=("label",), help_notes={"size": " (per run)"})
    actions = {a.dest: a for a in p._actions if a.dest != "help"}
    assert set(actions) == {"size", "example_label"}
    assert actions["size"].default == 9 and actions["size"].help == "how many (per run)"
    assert actions["example_label"].required
    # a namespace with some of the flags gives those fields only
    assert flag_values(Example, argparse.Namespace(size=4, other=1)) == {"size": 4}


@dataclasses.dataclass(frozen=True)
class Words:
    first: tuple[str, ...] = option(help="one word or more", positional=True)
    rest: tuple[str, ...] = option((), "any number of words", positional=True, metavar="WORD")
    loud: bool = option(False, "log more", short="l")


def test_positional_tuples_take_the_words_that_follow():
    p = argparse.ArgumentParser(exit_on_error=False)
    actions = {a.dest: a for a in add_arguments(p, Words)}
    assert (actions["first"].nargs, actions["rest"].nargs) == ("+", "*")  # no default: at least one
    assert actions["rest"].metavar == "WORD" and actions["loud"].option_strings == ["-l", "--loud"]
    assert from_arguments(Words, p.parse_args(["a", "b", "-l"])) == Words(first=("a", "b"), loud=True)
    with pytest.raises(SystemExit):  # argparse exits on a missing positional, exit_on_error or not
        p.parse_args([])


def test_every_action_knows_the_flag_that_made_it():
    p = argparse.ArgumentParser()
    made = add_arguments(p, Example)
    raw = p.add_argument("--raw")
    assert [added_flag(action).field for action in made] == list(flags_of(Example))
    assert added_flag(raw) is None and added_flag(p._actions[0]) is None  # a raw flag; argparse's --help


def test_a_flag_without_help_is_refused():
    @dataclasses.dataclass
    class Undocumented:
        size: int = 3

    with pytest.raises(ValueError, match="needs its help"):
        add_arguments(argparse.ArgumentParser(), Undocumented)


def test_the_jobs_input_flags_are_the_page_parsers_fields_read_back():
    """--max_page_bytes and --follow_links_outside_input are InputOptions' flags,
    defined by PageParser's fields, and a job reads them back into a PageParser."""
    from ritrag.pipelines.options import parse_job_options
    from ritrag.transforms.pages import InputOptions, PageParser

    given = parse_job_options(["--input", "in", "--max_page_bytes", "4096", "--follow_links_outside_input"],
                              {InputOptions: None}).view_as(InputOptions)
    parser = from_arguments(PageParser, given, root="in/", base_url="http://localhost/", site_depth=0)
    assert (parser.max_page_bytes, parser.follow_links_outside_input) == (4096, True)
    defaults = parse_job_options([], {InputOptions: None}).view_as(InputOptions)
    assert from_arguments(PageParser, defaults, root="in/", base_url="http://localhost/", site_depth=0) == \
        PageParser("in/", "http://localhost/", 0)


def test_the_eval_flags_are_the_eval_configs_and_the_agents_read_back():
    from ritrag.cli import build_parser
    from ritrag.evaluation.agent import AgentSettings
    from ritrag.evaluation.eval import EvalConfig

    args = build_parser("eval").parse_args(["eval", "idx", "q.jsonl", "--k", "7", "--chunks", "3",
                                            "--max_calls", "4", "--model", "m"])
    settings = from_arguments(AgentSettings, args)
    assert (settings.max_calls, settings.model) == (4, "m")
    assert from_arguments(EvalConfig, args, max_calls=settings.max_calls) == EvalConfig(k=7, chunks=3, max_calls=4)
    defaults = build_parser("eval").parse_args(["eval", "idx", "q.jsonl"])
    assert from_arguments(EvalConfig, defaults) == EvalConfig()
