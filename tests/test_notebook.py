"""notebooks/wan_t2v.ipynb executes top to bottom (tiny model, offline: no TPU here)."""

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks", "wan_t2v.ipynb")


def test_notebook_executes(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(
        out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "real model: False" in outputs and "9 frames" in outputs
    assert (tmp_path / "wan_t2v.mp4").stat().st_size > 0
