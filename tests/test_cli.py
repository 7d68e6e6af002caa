"""The command line as a user meets it: every flag in --help with its meaning
and default, from the one definition the jobs use; a mistyped flag refused
with the closest one named; Beam's own flags passed to Beam; refusals in one
line with an exit status (issue 24)."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ritrag import cli
from ritrag.flags import added_flag
from ritrag.pipelines import build, compact, crawl, refresh, update
from ritrag.pipelines.options import JobOptionsError, check_job_argv, job_actions
from support import ROOT, SAMPLE

JOBS = {"build": build, "update": update, "compact": compact, "crawl": crawl, "refresh": refresh}
MIXED = ROOT / "sample" / "mixed"


def ritrag(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command as installed (`python -m ritrag.cli`), from a folder outside the repository."""
    return subprocess.run([sys.executable, "-m", "ritrag.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def help_text(*command: str, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def documented_options(text: str) -> dict[str, str]:
    """option -> its help text, from an argparse --help page."""
    options, current = {}, None
    for line in text.splitlines():
        match = re.match(r"  (--\w+)(?: [A-Z_{},\w]+)?\s*(.*)", line)
        if match:
            current = match.group(1)
            options[current] = match.group(2)
        elif current and line.startswith("      "):
            options[current] += " " + line.strip()
        else:
            current = None
    return options


@pytest.mark.parametrize("name", JOBS)
def test_a_jobs_help_lists_every_flag_of_the_job_with_its_meaning(name, capsys):
    documented = documented_options(help_text(name, capsys=capsys))
    skipped = {"input", "seed"} | ({"index"} if name == "compact" else set())
    for action in job_actions(JOBS[name].FLAGS):
        flag = action.option_strings[0]
        if action.dest in skipped:
            continue
        assert flag in documented, f"{name} --help does not list {flag}"
        assert documented[flag].strip(), f"{name} --help: {flag} has no help line"
        if action.default not in (None, False, []) and not isinstance(action.default, bool):
            assert "default:" in documented[flag], f"{name} --help: {flag} shows no default"


def test_every_command_documents_every_option(capsys):
    for command in ("toc", "read", "serve", "mcp", "eval", "agent", "inspect", "synth", "prune", "rollback", "tools"):
        options = documented_options(help_text(command, capsys=capsys))
        assert options, command
        missing = [flag for flag, text in options.items() if flag != "--help" and not text.strip()]
        assert not missing, f"{command} --help: no help line for {missing}"


def arguments_no_field_made(command: str | None) -> list[str]:
    """The arguments of `ritrag` and of sub-command `command` that are no
    dataclass field's flag (ritrag.flags): argparse's --help, --version and
    sub-command choice aside, and Beam's own store options (S3Options,
    --project), which the index commands take from Beam's definition."""
    top = cli.build_parser(command)
    parsers = {"ritrag": top}
    if command:
        parsers[command] = top._subparsers._group_actions[0].choices[command]
    argparse_own = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [f"{name}: {'/'.join(action.option_strings) or action.dest}"
            for name, parser in parsers.items() for action in parser._actions
            if not isinstance(action, argparse_own) and action not in (parser.get_default("store_actions") or [])
            and added_flag(action) is None]


def test_every_argument_is_a_dataclass_fields_flag():
    """One mechanism for every flag: none added by hand (issue #39)."""
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    for command in (None, *commands):
        assert not arguments_no_field_made(command), command


def test_every_build_flag_the_readme_names_is_in_build_help(capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    usage = readme[readme.index("ritrag build DIR_OR_GLOB"):readme.index("ritrag toc INDEX")]
    named = set(re.findall(r"--\w+", usage)) - {"--runner", "--project", "--setup_file"}
    assert {"--site_depth", "--granularity", "--embed_dtype"} <= named
    assert named <= set(documented_options(help_text("build", capsys=capsys)))


def test_help_shows_defaults_from_the_one_definition(capsys):
    documented = documented_options(help_text("crawl", capsys=capsys))
    assert "default: 20)" in documented["--max_depth"]  # CrawlConfig.max_depth, also the job's
    assert crawl.CrawlConfig.max_depth == 20
    assert "(default: 0)" in documented_options(help_text("build", capsys=capsys))["--site_depth"]


def test_a_mistyped_flag_is_refused_naming_the_right_one(tmp_path):
    done = ritrag("build", str(MIXED), "--out", str(tmp_path / "x"), "--site_dept", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown option --site_dept; did you mean --site_depth?" in done.stderr
    assert not (tmp_path / "x" / "CURRENT").exists()
    # the Python API refuses it too
    with pytest.raises(JobOptionsError, match="did you mean --site_depth"):
        build.run(["--input", str(MIXED), "--out", str(tmp_path / "y"), "--site_dept", "1"])
    # a wrong value and a serving command's typo: exit 2 as well
    assert ritrag("build", str(MIXED), "--out", str(tmp_path / "x"), "--site_depth", "one", cwd=tmp_path).returncode == 2
    typo = ritrag("toc", str(tmp_path), "q", "--kk", "5", cwd=tmp_path)
    assert typo.returncode == 2 and "unrecognized arguments: --kk" in typo.stderr


def test_beams_own_options_pass_and_anything_after_a_double_dash():
    _, beam_flags = check_job_argv(["--input", "x", "--out", "y", "--runner", "FnApiRunner",
                                    "--direct_num_workers", "2", "--temp_location", "/tmp/t", "--",
                                    "--some_runner_flag", "1"], build.FLAGS)
    assert beam_flags == ["--runner", "FnApiRunner", "--direct_num_workers", "2", "--temp_location", "/tmp/t",
                          "--some_runner_flag", "1"]
    with pytest.raises(JobOptionsError, match="unknown option --runer; did you mean --runner"):
        check_job_argv(["--input", "x", "--runer", "DirectRunner"], build.FLAGS)
    # a flag of another job is not this job's
    with pytest.raises(JobOptionsError, match="unknown option --crawl_dir"):
        check_job_argv(["--input", "x", "--out", "y", "--crawl_dir", "c"], build.FLAGS)
    check_job_argv(["--crawl_dir", "c", "--index", "i", "--max_depth", "3", "--site_depth", "1"], refresh.FLAGS)


def test_cli_build_toc_read_as_installed(tmp_path):
    index = tmp_path / "idx"
    done = ritrag("build", str(MIXED), "--out", str(index), "--site_depth", "1", "--embedding_model", "hashing:384",
                  "--runner", "FnApiRunner", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"index": str(index), "version": "v000001"}
    assert "apitools" not in done.stderr and "Loading weights" not in done.stderr
    assert "ritrag.build INFO published v000001" in done.stderr  # the progress a person watches
    assert "% of" not in done.stderr or not re.search(r"1\d\d\.\d% of", done.stderr)  # never past 100%
    outline = ritrag("toc", str(index), "install the controller", "--format", "outline", cwd=tmp_path)
    assert outline.returncode == 0, outline.stderr
    first_id = re.match(r"\s*([a-z0-9]+)", outline.stdout).group(1)  # a line: id, *rank if a hit, title
    read = ritrag("read", str(index), first_id, cwd=tmp_path)
    assert read.returncode == 0 and json.loads(read.stdout)["nodes"][0]["id"] == first_id
    # a reader that stops early (`ritrag toc ... | head`) ends the command quietly
    piped = subprocess.Popen([sys.executable, "-m", "ritrag.cli", "toc", str(index), "install the controller"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    piped.stdout.close()
    assert piped.wait(timeout=600) == 0 and b"Traceback" not in piped.stderr.read()
    unknown = ritrag("read", str(index), "nosuchnode", cwd=tmp_path)
    assert unknown.returncode == 3
    # an update cannot reshape what the index was built with
    refused = ritrag("update", str(MIXED), "--index", str(index), "--site_depth", "2", cwd=tmp_path)
    assert refused.returncode == 2 and "--site_depth 2 (the index has 1)" in refused.stderr


def test_a_build_with_nothing_to_index_refuses_in_one_line(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.bin").write_bytes(b"\x00\x01 not a page")
    (junk / "b.cfg").write_text("a configuration file has no known kind")
    done = ritrag("build", str(junk), "--out", str(tmp_path / "idx"), "--embedding_model", "hashing:384", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert line["error"]["reason"] == "nothing_to_publish"
    assert "read 2 pages" in line["error"]["message"] and "unknown_kind 2" in line["error"]["message"]


def test_sample_build_help_and_typo_via_the_entry_point(tmp_path):
    """The console script itself (what `pip install` puts on PATH) parses like main()."""
    script = Path(sys.executable).with_name("ritrag")
    if not script.exists():
        pytest.skip("no ritrag console script beside this interpreter")
    done = subprocess.run([str(script), "build", str(SAMPLE), "--out", str(tmp_path / "i"), "--granularty", "page"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did you mean --granularity?" in done.stderr


@pytest.mark.parametrize("command", [["versions"], ["prune", "--keep", "2"]])
def test_a_path_without_an_index_is_an_error_not_an_empty_answer(tmp_path, command):
    """A mistyped index path: `ritrag versions` and `prune` say it holds no
    version (exit 1), and prune makes no folder there (its lease would)."""
    missing = tmp_path / "no-such-index"
    done = ritrag(command[0], str(missing), *command[1:], cwd=tmp_path)
    assert done.returncode == 1
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"]["reason"] == "index_unavailable"
    assert not missing.exists()
