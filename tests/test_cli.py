"""The `perx` command: help, unknown commands, and a tiny benchmark run."""

import subprocess
import sys

import pytest

from bench_buffer import main as bench_main  # benchmarks/ (pytest's pythonpath)
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


def test_help_columns_are_aligned_and_every_command_is_listed(capsys):
    from perx.cli import COMMANDS

    assert main(["--help"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert [line.split()[0] for line in lines] == [name for name, _, _ in COMMANDS]
    assert len({len(line) - len(line[2:].split(maxsplit=1)[1]) for line in lines}) == 1  # descriptions line up


def test_help_into_a_closed_pipe_prints_no_traceback():
    out = subprocess.run(f"{sys.executable} -m perx.cli --help | head -1", shell=True, capture_output=True, text=True)
    assert out.stdout.startswith("usage: perx") and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


REFUSALS = [
    (["--steps", "-5"], "--steps: must be >= 1, got -5"),
    (["--steps", "0"], "--steps: must be >= 1, got 0"),
    (["--env", "Nope-v0"], "--env: unknown environment 'Nope-v0'"),
    (["--env", "MinAtar/Nope-v0"], "--env: unknown environment 'MinAtar/Nope-v0'"),
    (["--steps", "100"], "--steps: 100 ends before the first update (learning_starts = 5000)"),
    (["--variant", "bogus"], "argument --variant: invalid choice: 'bogus'"),
    (["--preset", "bogus"], "argument --preset: invalid choice: 'bogus'"),
    (["--set", "nonsense=1"], "--set: expected FIELD=VALUE with a DQNConfig field, got 'nonsense=1'"),
    (["--set", "learning_rate=fast"], "--set: learning_rate takes a"),
]


@pytest.mark.parametrize(("args", "message"), REFUSALS, ids=[" ".join(a) for a, _ in REFUSALS])
def test_perx_dqn_refuses_bad_input_on_one_line_with_status_2_before_writing(tmp_path, capsys, args, message):
    pytest.importorskip("torch")
    pytest.importorskip("minatar")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["dqn", *args, "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("perx dqn: error: ") and message in err, err
    assert not out.exists()  # nothing written


def test_perx_plot_says_why_a_gain_table_is_missing(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from perx.experiments import study

    d = tmp_path / "s" / "CartPole-v1" / "per" / "seed=0"
    d.mkdir(parents=True)
    (d / "metrics.csv").write_text("step,episodes,eval_return,train_return,loss,steps_per_second,runs_in_process\n"
                                   "100,3,20,18,0.5,100,1\n")
    messages = []
    study.plot(tmp_path / "s", log=messages.append)
    table = (tmp_path / "s" / "table.md").read_text()
    assert "(No gain over uniform: this study has no uniform runs.)" in table
    assert any("no gain over uniform" in m for m in messages)


def test_study_outputs_default_to_a_folder_git_ignores():
    from perx.experiments import study

    assert study.find_study("a-study-that-does-not-exist", None) == study.Path("runs") / "a-study-that-does-not-exist"
    ignored = (study.Path(__file__).resolve().parents[1] / ".gitignore").read_text().splitlines()
    assert "runs/" in ignored


# (module (bench_*: benchmarks/), default output, what it needs to import): each command's --out default lies
# under runs/, which git ignores, so that no run -- nor an interrupted one -- replaces a committed file; the
# committed results are regenerated by naming results/... as --out.
DEFAULT_OUTS = [
    ("bench_buffer", "runs/bench.md", ()),
    ("perx.experiments.theory", "runs/theory", ()),
    ("bench_td3_overhead", "runs/td3_overhead.md", ()),
    ("bench_agents", "runs/agents_bench.md", ("torch",)),
    ("perx.experiments.apex", "runs/apex", ("torch", "ray")),
]


@pytest.mark.parametrize(("module", "default", "needs"), DEFAULT_OUTS, ids=[m for m, _, _ in DEFAULT_OUTS])
def test_command_output_defaults_to_a_folder_git_ignores(module, default, needs):
    import importlib

    for name in needs:
        pytest.importorskip(name)
    mod = importlib.import_module(module)
    assert mod.DEFAULT_OUT == default
    assert mod.build_parser().parse_args([]).out == default


def test_an_interrupted_run_leaves_git_status_clean(tmp_path):
    pytest.importorskip("torch")
    import shutil
    import signal
    import time
    from pathlib import Path

    repo = tmp_path / "project"
    repo.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / ".gitignore", repo / ".gitignore")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", ".gitignore"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=repo, check=True)
    run = subprocess.Popen([sys.executable, "-m", "perx.cli", "dqn", "--env", "CartPole-v1", "--steps", "100000",
                            "--set", "learning_starts=100", "eval_every=200", "eval_episodes=1", "capacity=1000"],
                           cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not list(repo.glob("runs/dqn/*/*/seed=0/checkpoint/state-*.pt")) and time.time() < deadline:
            time.sleep(0.5)
        assert list(repo.glob("runs/dqn/*/*/seed=0/metrics.csv")), "the run wrote nothing in 120 s"
    finally:
        run.send_signal(signal.SIGKILL)  # interrupted mid-run
        run.wait()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""  # everything it wrote is under runs/, which git ignores


def test_every_registered_command_resolves_to_a_function_taking_argv_and_prog():
    import inspect

    from perx.cli import COMMANDS, resolve

    assert len({name for name, _, _ in COMMANDS}) == len(COMMANDS)
    for name, target, _ in COMMANDS:
        assert "prog" in inspect.signature(resolve(target)).parameters, name


def test_every_registered_agent_has_a_config_variants_and_train():
    import dataclasses
    import importlib

    from perx.experiments.study import AGENTS, agent

    for name, (module, _, defaults) in AGENTS.items():
        config_class, train = agent(name)
        assert dataclasses.is_dataclass(config_class) and callable(train)
        assert importlib.import_module(module).VARIANTS and set(defaults) == {"envs", "variants", "total_steps"}


def test_a_one_seed_cell_states_the_seed_count_instead_of_a_zero_interval():
    from perx.experiments.study import mean_cell

    assert mean_cell([3.0]) == "3.00 (1 seed)"  # no interval exists for one seed; "± 0.00" would claim one
    assert mean_cell([1.0, 3.0]) == "2.00 ± 12.71"  # t(0.975, 1) * sd 1.414 / sqrt 2


def test_bold_marks_the_intervals_that_reach_the_best_as_004_table_1():
    from perx.experiments.study import overlapping_best

    # t(0.975, 2) = 4.303, sd 1, n 3: half-width 2.484 for each of these
    scores = {"best": [9.0, 10.0, 11.0], "touching": [4.0, 5.0, 6.0], "apart": [3.0, 4.0, 5.0]}
    # best: [7.52, 12.48]; touching: [2.52, 7.48] misses by 0.04; apart misses by more
    assert overlapping_best(scores) == {"best"}
    scores["touching"] = [4.1, 5.1, 6.1]  # [2.62, 7.58] now reaches 7.52
    assert overlapping_best(scores) == {"best", "touching"}
    assert overlapping_best({"best": [9.0, 10.0, 11.0], "one seed": [1.0]}) == set()  # no interval: no bold
    assert overlapping_best({"alone": [1.0, 2.0]}) == set()
