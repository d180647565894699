"""`import perx` stays light: no torch, gymnasium or matplotlib."""

import subprocess
import sys


def test_import_perx_does_not_import_heavy_frameworks():
    code = (
        "import sys, perx\n"
        "heavy = [m for m in ('torch', 'gymnasium', 'matplotlib', 'tianshou', 'cpprb') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
