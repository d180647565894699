"""The `perx` command: help, unknown commands, and a tiny benchmark run."""

import subprocess
import sys

from perx.bench import main as bench_main
from perx.cli import main


def test_help_lists_the_bench_command(capsys):
    assert main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out


def test_unknown_command_fails_with_usage(capsys):
    assert main(["nope"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_bench_prints_a_table_with_ratios_to_the_floor(tmp_path, capsys):
    out = tmp_path / "bench.md"
    assert bench_main(["--sizes", "2000", "--batch-sizes", "8", "--blocks", "2", "--calls", "5",
                       "--no-peers", "--frame-size", "1000", "--out", str(out)]) == 0
    table = out.read_text()
    assert "| sample+update B=8 | 2e3 | " in table
    assert "perx.Proportional" in table and "(1.00x)" in table
    assert "| add (1 row) |" in table and "| extend (256 rows) |" in table
    assert "| Atari obs uint8[4, 84, 84] | Episodes(n_step=3, frame_stack=4) | 1e3 | 8 |" in table


def test_bench_only_times_the_implementations_named(tmp_path, capsys):
    out = tmp_path / "bench.md"
    assert bench_main(["--sizes", "2000", "--batch-sizes", "8", "--blocks", "2", "--calls", "5", "--no-episodes",
                       "--only", "floor", "perx.Proportional out=", "--out", str(out)]) == 0
    header = next(line for line in out.read_text().splitlines() if line.startswith("| operation | N |"))
    assert header == "| operation | N | floor | perx.Proportional out= |"


def test_help_lists_the_agent_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {c} " in out for c in ("dqn", "td3", "study", "plot", "bench-agents"))


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "perx.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "bench" in out.stdout
