"""The ``alt-tvm`` console command dispatches to its subcommands and refuses bad ones."""

import json
import subprocess
import sys

import pytest

from alt_tvm.cli import main


def test_dse_subcommand_prints_the_counts_as_json(capsys):
    assert main(["dse", "--shape", "400", "120", "--json", "--count-only"]) == 0
    obj = json.loads(capsys.readouterr().out)
    counts = {k: obj[k] for k in ("all", "alignment", "vectorization", "initial_layer", "scalability")}
    assert counts["all"] >= counts["alignment"] >= counts["vectorization"] >= counts["scalability"]


def test_unknown_subcommand_and_bad_model_are_clear_errors(capsys):
    assert main(["bogus"]) == 2
    assert "unknown command 'bogus'; choose from tune, dse" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="neither a file nor a reference model"):
        main(["tune", "no_such_model", "--trials", "4"])


def test_console_script_is_installed():
    done = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points as e; "
                           "print([x.value for x in e(group='console_scripts') if x.name == 'alt-tvm'])"],
                          capture_output=True, text=True, check=True)
    assert "alt_tvm.cli:main" in done.stdout
