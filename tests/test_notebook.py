"""Executes experiments/kernel_exploration.ipynb on CPU (interpret mode, tiny sizes)."""

import os
import pathlib

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_kernel_exploration_notebook_runs():
  nb = nbformat.read(ROOT / "experiments" / "kernel_exploration.ipynb", as_version=4)
  env_backup = os.environ.get("MPLBACKEND")
  os.environ["MPLBACKEND"] = "Agg"  # the kernel inherits it: no display needed
  try:
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
  finally:
    if env_backup is None:
      os.environ.pop("MPLBACKEND", None)
    else:
      os.environ["MPLBACKEND"] = env_backup
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "compiles: 1" in outputs
  errs = [float(line.split()[-1]) for line in outputs.splitlines() if "rel err" in line]
  assert len(errs) == 4 and max(errs) < 1e-5  # CPU runs float32
  # The Hopper kernel set in Mosaic GPU's interpret mode, bf16.
  errs = [float(line.split()[-1]) for line in outputs.splitlines() if "vs reference" in line]
  assert len(errs) == 4 and max(errs) < 2e-2
