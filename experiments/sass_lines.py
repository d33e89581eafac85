"""SASS instructions per source line of a Mosaic GPU kernel, on any machine (no GPU): the PTX
Mosaic GPU dumps, assembled for sm_90a by ptxas and disassembled with its line table by
nvdisasm. Shows where a kernel's instructions come from - which line's softmax, mask or
copy costs what - and where registers spill.

    # on the GPU machine: the PTX of every kernel a script compiles
    mkdir -p /tmp/dump && MOSAIC_GPU_DUMP_TO=/tmp/dump MOSAIC_GPU_DUMP_PTX=1 \\
        MOSAIC_GPU_DUMP_PTXAS=1 python3 experiments/persistent_forward.py ...
    # anywhere: ptxas and nvdisasm on PATH or in --bin (the nvidia-cuda-nvcc wheel's
    # nvidia/cu13/bin holds both)
    python3 experiments/sass_lines.py /tmp/dump/moba_fwd_hopper_0.ptx --top 30

Prints ptxas' register and spill report, the instructions of the --top source lines that
have the most, by opcode, and each spill store or load (STL, LDL) with its source line. A
line's count includes every copy the compiler made of it (both branches of a cond, a peeled
first step), not how often it runs. A ptxas other than the one Mosaic GPU ran may allocate
registers differently: compare the report printed with the dumped .ptxas file.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

_LINE = re.compile(r'## File "([^"]+)", line (\d+)')
_INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)")


def tool(name: str, bin_dir: str | None) -> str:
  path = os.path.join(bin_dir, name) if bin_dir else shutil.which(name)
  if not path or not os.access(path, os.X_OK):
    raise SystemExit(f"{name} not found {'in ' + bin_dir if bin_dir else 'on PATH'}: pass "
                     "--bin, e.g. the nvidia/cu13/bin folder of the nvidia-cuda-nvcc wheel")
  return path


def disassemble(ptx: str, bin_dir: str | None, arch: str) -> tuple[str, str]:
  """(ptxas' report, nvdisasm's listing with line info) of the PTX file `ptx`."""
  with tempfile.TemporaryDirectory() as tmp:
    cubin = os.path.join(tmp, "kernel.cubin")
    asm = subprocess.run([tool("ptxas", bin_dir), f"-arch={arch}", "-O3", "-v", ptx, "-o",
                          cubin], capture_output=True, text=True)
    if asm.returncode:
      raise SystemExit(f"ptxas failed on {ptx}:\n{asm.stderr[-3000:]}")
    dis = subprocess.run([tool("nvdisasm", bin_dir), "-c", "-g", cubin], capture_output=True,
                         text=True, check=True)
  report = "\n".join(line for line in asm.stderr.splitlines()
                     if "Used" in line or "spill" in line)
  return report, dis.stdout


def per_line(sass: str):
  """({(file, line): Counter of opcodes}, [(file, line, spill instruction)])."""
  where, counts, spills = None, collections.defaultdict(collections.Counter), []
  for text in sass.splitlines():
    m = _LINE.search(text)
    if m:
      where = (os.path.basename(m.group(1)), int(m.group(2)))
      continue
    m = _INSTR.match(text)
    if m:
      op = m.group(2)
      counts[where][op.split(".")[0]] += 1
      if op.startswith(("STL", "LDL")):
        operands = m.group(3).split(";")[0].split("(*")[0].strip()
        spills.append((*(where or ("?", 0)), f"{op} {operands}"))
  return counts, spills


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("ptx", help="a .ptx file Mosaic GPU dumped (MOSAIC_GPU_DUMP_PTX=1)")
  p.add_argument("--bin", default=None, help="folder holding ptxas and nvdisasm")
  p.add_argument("--arch", default="sm_90a")
  p.add_argument("--top", type=int, default=30, help="source lines shown")
  p.add_argument("--sass", default=None, help="also write the disassembly here")
  args = p.parse_args()
  report, sass = disassemble(args.ptx, args.bin, args.arch)
  if args.sass:
    with open(args.sass, "w") as f:
      f.write(sass)
  counts, spills = per_line(sass)
  total = sum(sum(c.values()) for c in counts.values())
  print(report)
  print(f"{total} instructions; the {args.top} source lines with the most:")
  ranked = sorted(counts.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]
  for where, ops in ranked:
    name = f"{where[0]}:{where[1]}" if where else "(no line)"
    mix = " ".join(f"{op} {n}" for op, n in ops.most_common(6))
    print(f"  {sum(ops.values()):6d}  {name:24s} {mix}")
  if spills:
    print(f"{len(spills)} spill instructions:")
    for file, line, instr in spills:
      print(f"  {file}:{line}  {instr.strip()}")


if __name__ == "__main__":
  main()
