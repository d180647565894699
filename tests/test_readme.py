"""The README's usage example runs as written (documentation that is executed cannot drift)."""

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs(tmp_path):
    text = README.read_text()
    usage = text[text.index("## Use"):]
    code = re.search(r"```python\n(.*?)```", usage, re.S).group(1)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the example saves replay.npz
    try:
        namespace: dict = {}
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["applied"] == 32
    assert len(namespace["buf"]) == 65 and (tmp_path / "replay.npz").exists()
