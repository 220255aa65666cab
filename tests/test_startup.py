"""What keeps `lemonade` and the server quick to start (docs/performance.md, "Start-up"): which
modules a command imports, and that what is deferred still works when it is used.

No timings are asserted (the figures are benchmarks/bench_startup.py's); each check is about
which modules a fresh interpreter has imported after doing one thing, in a subprocess, and about
the behaviour of what was made lazy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from lemonade.cli import main as cli_main
from lemonade.cli.parsing import skip_coercing_absent_values
from lemonade.util.lazy import lazy_module


def imported_after(code: str, *names: str) -> list[str]:
    """Which of `names` a fresh interpreter has imported after running `code` (a module made lazy by
    util/lazy.py is in sys.modules before it is executed: it counts once it is)."""
    loaded = "[n for n in {names!r} if n in sys.modules and type(sys.modules[n]).__name__ != '_LazyModule']"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({loaded.format(names=list(names))}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_command_imports_only_its_own_module():
    register = "import lemonade.cli.main as m\nm._register_commands({!r})"
    others = ["lemonade.cli.chat_cmd", "lemonade.cli.bench_cmd", "lemonade.cli.models_cmd", "lemonade.cli.launch_cmd"]
    assert imported_after(register.format("status"), "lemonade.cli.info", *others) == ["lemonade.cli.info"]
    # `serve` (the server start) imports no client command, nor the CLI's HTTP client, rich or httpx
    assert imported_after(register.format("serve"), "lemonade.cli.info", "lemonade.cli.client", "rich", "httpx",
                          *others) == []
    # no command, or one no module registers: all of them (the root help lists every command)
    assert imported_after(register.format(None), *others) == others


def test_help_lists_every_command_without_importing_httpx_psutil_or_pydantic():
    code = "import lemonade.cli.main as m\nm._register_commands()"
    assert imported_after(code, "httpx", "psutil", "pydantic", "lemonade.cli.chat_cmd") == ["lemonade.cli.chat_cmd"]


def test_the_command_table_is_what_the_modules_register():
    """COMMAND_MODULES (cli/main.py) decides which module a command's run imports: it must name
    exactly the commands and groups each module registers."""
    import importlib

    for module, names in cli_main.COMMAND_MODULES.items():
        app = typer.Typer()
        importlib.import_module(f"lemonade.cli.{module}").register(app)
        registered = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
        registered += [g.name or "" for g in app.registered_groups]
        assert sorted(registered) == sorted(names), module


def test_every_command_module_is_in_the_table_and_help_lists_every_command():
    """A module of lemonade/cli with a `register` that COMMAND_MODULES does not name would never be
    registered (its commands gone from `lemonade` and its help); the root help lists them all."""
    import re
    from pathlib import Path

    cli_dir = Path(cli_main.__file__).parent
    registering = {f.stem for f in cli_dir.glob("*.py") if re.search(r"^def register\(", f.read_text(), re.M)}
    assert registering == set(cli_main.COMMAND_MODULES)
    proc = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    listed = set(re.findall(r"^  (\S+) ", proc.stdout, re.M))
    expected = {name for names in cli_main.COMMAND_MODULES.values() for name in names} | {"serve"}
    assert expected <= listed, sorted(expected - listed)


@pytest.mark.parametrize(("args", "command"), [
    (["status"], "status"), (["--host", "h", "--port", "1", "status", "--json"], "status"),
    (["--host=h", "list"], "list"), (["--no-discovery", "serve", "--port", "9"], "serve"),
    (["--api-key", "k", "--help"], None), ([], None), (["--", "status"], None), (["--version"], None),
])
def test_command_in_finds_the_command_after_the_root_options(args, command):
    assert cli_main.command_in(args) == command


# One app with each kind of parameter the CLI uses, run through a set of argument lists; what it
# prints is compared with and without `skip_coercing_absent_values`, each in a fresh interpreter.
TYPER_PROBE = """
import enum, json, os, pathlib, sys
import typer
from typer.testing import CliRunner
from lemonade.cli.parsing import skip_coercing_absent_values

if sys.argv[1] == "patched":
    skip_coercing_absent_values()
    skip_coercing_absent_values()  # twice: still one wrapper

class Kind(str, enum.Enum):
    a = "a"
    b = "b"

app = typer.Typer()
seen = []

def record(value):
    seen.append(["callback", value])
    return value

@app.command()
def go(arg: str | None = typer.Argument(None), count: int | None = typer.Option(None, "--count"),
       name: str = typer.Option("x", "--name"), many: list[int] | None = typer.Option(None, "--many"),
       kind: Kind | None = typer.Option(None, "--kind"), path: pathlib.Path | None = typer.Option(None, "--path"),
       flag: bool = typer.Option(False, "--flag"), env: int | None = typer.Option(None, "--env", envvar="PROBE_ENV"),
       called: str | None = typer.Option(None, "--called", callback=record)) -> None:
    seen.append([arg, count, name, many, kind and kind.value, path and str(path), flag, env, called])

@app.command()
def need(must: int = typer.Option(..., "--must"), which: Kind = typer.Argument(...)) -> None:
    seen.append(["need", must, which.value])

runner, results = CliRunner(), []
for args, environ in [(["go"], {}), (["go", "p", "--count", "5", "--many", "1", "--many", "2", "--kind", "b",
                                      "--path", "/tmp", "--flag", "--called", "c"], {}),
                      (["go", "--count", "five"], {}), (["go", "--kind", "z"], {}), (["go"], {"PROBE_ENV": "7"}),
                      (["go"], {"PROBE_ENV": "seven"}), (["need"], {}), (["need", "a"], {}),
                      (["need", "--must", "3", "b"], {})]:
    seen.clear()
    result = runner.invoke(app, args, env=environ)
    results.append([args, environ, result.exit_code, result.output, list(seen)])
print(json.dumps(results))
"""


def test_absent_values_skip_typer_coercion_and_nothing_else_changes():
    """`skip_coercing_absent_values` (cli/parsing.py) replaces a private method of typer's: every
    argument list, given values or not, valid or not, gets from the patched typer exactly what it
    gets from typer itself (values, defaults, callbacks, envvars, errors and their messages)."""
    def run(mode: str) -> list[object]:
        proc = subprocess.run([sys.executable, "-c", TYPER_PROBE, mode], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "100", "TERM": "dumb"})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    patched, stock = run("patched"), run("stock")
    assert patched == stock
    outcomes = {tuple(args) + tuple(environ.values()): (code, seen) for args, environ, code, _out, seen in stock}
    assert outcomes[("go",)] == (0, [["callback", None], [None, None, "x", None, None, None, False, None, None]])
    assert outcomes[("go", "seven")][0] == 2 and outcomes[("go", "--count", "five")][0] == 2
    assert outcomes[("need",)][0] == 2 and outcomes[("need", "--must", "3", "b")] == (0, [["need", 3, "b"]])


def test_typer_patch_is_applied_once_and_only_to_a_typer_it_knows():
    """The patch wraps typer's own method once; a typer whose coercion has another shape (here: no
    `RuntimeParam.coerce`) is left alone."""
    import typer.core

    skip_coercing_absent_values()
    wrapped = typer.core._TyperParameter.process_value
    assert getattr(wrapped, "skips_absent", False)
    skip_coercing_absent_values()
    assert typer.core._TyperParameter.process_value is wrapped
    code = ("import typer, typer.core, typer._coercion\n"
            "stock = typer.core._TyperParameter.process_value\n"
            "del typer._coercion.RuntimeParam.coerce\n"
            "from lemonade.cli.parsing import skip_coercing_absent_values\n"
            "skip_coercing_absent_values()\n"
            "assert typer.core._TyperParameter.process_value is stock")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_status_with_nothing_given_imports_no_pydantic():
    """typer coerces values through pydantic; a command given no values never needs it."""
    code = ("import sys\nsys.argv = ['lemonade', 'status', '--port', '1', '--no-discovery']\n"
            "import lemonade.cli.main as m\ntry:\n    m.main()\nexcept SystemExit:\n    pass")
    assert imported_after(code, "pydantic") == ["pydantic"]  # --port 1 is a value: coerced by typer
    code = code.replace("'--port', '1', ", "")
    env_code = "import os\nos.environ['LEMONADE_PORT'] = '1'\n" + code
    assert imported_after(env_code, "pydantic", "lemonade.cli.info") == ["lemonade.cli.info"]


def test_status_against_a_server_imports_no_httpx(make_server):
    """`lemonade status` (and every plain JSON command) talks to the server through the standard
    library's http.client (cli/client.py): importing httpx would be a third of the command."""
    server = make_server()
    code = (f"import os, sys\nos.environ['LEMONADE_PORT'] = '{server.port}'\nsys.argv = ['lemonade', 'status']\n"
            "import lemonade.cli.main as m\ntry:\n    m.main()\nexcept SystemExit as exc:\n"
            "    assert exc.code in (0, None), exc.code\n")
    assert imported_after(code, "httpx", "lemonade.cli.info") == ["lemonade.cli.info"]


def test_lazy_module_loads_on_first_attribute(tmp_path, monkeypatch):
    ran = tmp_path / "ran"
    (tmp_path / "lazy_probe_mod.py").write_text(f"open({str(ran)!r}, 'a').write('x')\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_mod", raising=False)
    module = lazy_module("lazy_probe_mod")
    assert sys.modules["lazy_probe_mod"] is module
    assert not ran.exists()  # not executed yet
    assert module.VALUE == 42 and ran.read_text() == "x"
    assert module.VALUE == 42 and ran.read_text() == "x"  # executed once
    assert lazy_module("lazy_probe_mod") is module and lazy_module("json") is json
    with pytest.raises(ModuleNotFoundError):
        lazy_module("no_such_module_here")


def test_openapi_answer_models_wait_for_the_first_document():
    """api/responses.py (the documented answers) and the request bodies' schemas are made when
    /openapi.json is first built, not at import."""
    code = "import lemonade.api.app"
    assert imported_after(code, "lemonade.api.responses") == []
    code = ("import lemonade.api.openapi as o, lemonade.api.app\n"
            "assert o._BODIES and not any(schema for schema, _ in o._BODIES)")
    assert imported_after(code, "lemonade.api.responses") == []
