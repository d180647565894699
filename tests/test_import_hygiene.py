"""`import perx` stays light: no torch, gymnasium, matplotlib, ray or stable-baselines3; layers import downward."""

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "perx"
HEAVY = ("torch", "gymnasium", "matplotlib", "tianshou", "cpprb", "stable_baselines3", "ray")


def test_import_perx_does_not_import_heavy_frameworks():
    code = (
        "import sys, perx, perx.gym\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_core_imports_no_agents_envs_experiments_or_integrations():
    upper = ("perx.agents", "perx.envs", "perx.experiments", "perx.sb3", "perx.gym", "perx.distributed",
             "perx.torch", "perx.torchrl", "perx.cli", "bench_", "benchmarks")
    core = [p for p in SRC.glob("*.py") if p.stem not in ("sb3", "gym", "cli")]
    core += list((SRC / "samplers").glob("*.py"))
    for path in core:
        bad = {m for m in imports(path) if m.startswith(upper) or m.split(".")[0] in HEAVY}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_integrations_use_the_public_api_not_private_kernels():
    for name in ("sb3.py", "gym.py", "distributed/replay.py", "distributed/apex.py"):
        private = {m for m in imports(SRC / name) if m.startswith("perx.") and any(
            part.startswith("_") for part in m.split("."))}
        assert not private, f"{name} imports {sorted(private)}"


def test_the_package_imports_no_benchmark():
    """Benchmarks live in the checkout's benchmarks/ folder; only ``perx.cli`` runs them, by file path."""
    for path in SRC.rglob("*.py"):
        bad = {m for m in imports(path) if m.startswith(("bench_", "benchmarks"))}
        assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


def test_layers_above_the_core_use_its_public_api_only():
    """Agents, integrations, torch, distributed and the studies import no private core module (perx._x,
    perx.samplers._x) and no private name (``from perx.storage import _x``); their own private helpers are theirs."""
    above = ("agents", "experiments", "torch", "torchrl", "distributed")
    files = [p for d in above for p in (SRC / d).rglob("*.py")]
    files += [SRC / "sb3.py", SRC / "gym.py", SRC / "cli.py"]
    for path in files:
        layer = path.relative_to(SRC).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] != "perx" or (len(parts) > 1 and parts[1] == layer):
                    continue  # another package, or this layer's own modules
                private = [p for p in parts[1:] if p.startswith("_")] + [n for n in names if n.startswith("_")]
                assert not private, f"{path.relative_to(SRC)} imports {module}: {private}"
