"""``examples/quickstart.ipynb`` runs top to bottom in a fresh kernel (nbclient), so the quickstart cannot rot:
weights loaded, features extracted with an index, a PCA map drawn, and a kNN probe above chance."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_the_quickstart_notebook_runs_and_says_what_it_claims(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env_path) if p)
    try:
        NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                       ).execute()  # fmt: skip
    finally:
        os.environ["PYTHONPATH"] = env_path
    text = [
        "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    assert "EMA" in text[1]  # weights_info names the copy
    assert text[2].startswith("8 rows;") and '"file"' in text[2]  # 4 clips of 16 frames, two 8-frame windows each
    images = [o for o in notebook.cells[7].outputs if o.get("output_type") == "display_data"]
    assert images and "image/png" in images[0]["data"]  # the PCA / similarity map is shown
    accuracies = {task: float(acc) for task, acc in re.findall(r"^(\w+)\s+kNN\s+([\d.]+) %", text[-1], flags=re.M)}
    chances = dict(re.findall(r"^(\w+)\s+kNN.*chance ([\d.]+) %", text[-1], flags=re.M))
    assert set(accuracies) == {"appearance", "motion"}
    assert accuracies["motion"] > float(chances["motion"])  # even a 30-step encoder sees which way things move
    assert (tmp_path / "quickstart_features" / "index.jsonl").is_file()
