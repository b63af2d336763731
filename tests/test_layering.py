"""The library's shape, checked: the layers data flows through and no import cycles (import-linter's contracts in
pyproject.toml), and no module importing another module's private names."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("retriever", "cli", "benchmarks", "tests")


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a test dependency: pip install -e '.[dev]'"
    result = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            private = [alias.name for alias in node.names if alias.name.startswith("_") and
                       not (alias.name.startswith("__") and alias.name.endswith("__"))]
            ours = node.module.split(".")[0] in CHECKED or node.level > 0
            if private and ours:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {', '.join(private)} from {node.module}")
    return found


@pytest.mark.parametrize("package", CHECKED)
def test_no_module_imports_another_module_s_private_names(package):
    found = [line for path in sorted((REPO / package).rglob("*.py")) for line in _private_imports(path)]
    assert not found, "\n".join(found)


def test_the_library_api_is_importable_from_the_package():
    import retriever

    assert retriever.Index.__name__ == "Index" and retriever.RetrieverError.__name__ == "RetrieverError"
    assert (REPO / "retriever" / "py.typed").is_file()
