"""Builds the probe trees of the 2026-12-01 (fourth session) calls: copies of a source tree
whose Hopper kernels leave one piece of work out (or do less of it), to time what that piece
costs. Their results are wrong by construction; only their time is read. The calls probed
0c722e2's kernels; notake and dqq match those only (dq's take changed after), the others
later kernels too.

    git archive 0c722e2 pallas_kernels experiments | tar -x -C ab_x
    python3 benchmarks/h200/probes/make_probes.py ab_x halfv   # then TREES=". ab_x" ab_call.sh

Probes: halfv (forward and dq load V, dk/dv dO, only on a slot's first fill: half the K/V
traffic), noexp (no exponentials in any kernel), norescale (the forward's output is not
rescaled per key step), nosoftmax (the forward's unmasked key steps skip the softmax and the
rescale), notake (forward and dq: no wait for the last output's store and no staging-to-tile
move), noepi (the forward stores no output), dqq (dq moves dO only and lets the last output's
store pend: what sending q straight into a second tile would save); prepared for a later
call and run in the fifth session's (benchmarks/h200/turns/): noturns (all three kernels: the
compute warpgroups issue their products without taking turns - what the turn handoffs cost;
applies to 0c722e2 up to 0840cd1, after which the kernels have it as pingpong=False).
Run in the sixth 2026-12-01 session's (benchmarks/h200/gather/): dblsteps (forward and dq:
every item runs twice its key steps, the second half on the next block's keys - what a key
step costs against an item's fixed part: T(dblsteps) - T is the steps' share, 2T - T(dblsteps)
the per-item part; applies to 0c722e2 and later) and allbox (forward and dq: every half of
every item comes as one strided box, as own-block halves do, in place of 64 single-row copies
- the wrong rows, the right amount of data, the masks still the sorted rows' own: what the
row-by-row gather costs; applies to 03451ad and later).
"""

import pathlib
import sys

TAKE = '''  with jax.named_scope("take_wait_store"):
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
  with jax.named_scope("take_rows"):
    for stage, tile in zip(scoped.stages, scoped.tiles):
      tile.at[wg][...] = stage.at[wg][...]
'''
SOFTMAX_RESCALE = '''          m_next, l_next, p16, corr = softmax(s_RK, step, kslot, m_prev, l_prev, masked)
          acc = acc * lax.broadcast_in_dim(corr, acc.shape, [0])'''
EXPS = ['jnp.exp2(s_RK * scale - lax.broadcast_in_dim(m_next, shape, [0]))',
        'jnp.exp2(s_RK - lax.broadcast_in_dim(m_next, shape, [0]))',
        'jnp.exp2(s_RK * (sm_scale * _LOG2E) - lse_RK)',
        'jnp.exp2(s_KR * (sm_scale * _LOG2E) - cols(rowf_smem.at[slot, 0]))']

TURNS = '''  wg = lax.axis_index("wg")
  pl.when(wg == 1)(lambda: plgpu.barrier_arrive(turn.at[0]))
  wait_turn = lambda: plgpu.barrier_wait(turn.at[wg])
  end_turn = lambda: plgpu.barrier_arrive(turn.at[1 - wg])
  return wait_turn, end_turn, lambda: pl.when(wg == 0)(wait_turn)
'''

PROBES = {
    "halfv": [
        ('''        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[vslot], bars.v.at[vslot])
        return gstep + 1''',
         '''        pl.when(gstep < v_stages)(
            lambda: plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[vslot], bars.v.at[vslot]))
        pl.when(gstep >= v_stages)(lambda: plgpu.barrier_arrive(bars.v.at[vslot]))
        return gstep + 1'''),
        ('''        for src, dst in ((qs_ref, q_smem.at[slot]), (dos_ref, do_smem.at[slot]),
                         (lse2_ref, rowf_smem.at[slot, 0]), (delta_ref, rowf_smem.at[slot, 1]),
                         (seg_ref, rowi_smem.at[slot, 0]), (pos_ref, rowi_smem.at[slot, 1])):
          plgpu.copy_gmem_to_smem(src.at[rows], dst, chunk_bar.at[slot])''',
         '''        for src, dst in ((qs_ref, q_smem.at[slot]),
                         (lse2_ref, rowf_smem.at[slot, 0]), (delta_ref, rowf_smem.at[slot, 1]),
                         (seg_ref, rowi_smem.at[slot, 0]), (pos_ref, rowi_smem.at[slot, 1])):
          plgpu.copy_gmem_to_smem(src.at[rows], dst, chunk_bar.at[slot])
        pl.when(cstep < stages)(lambda: plgpu.copy_gmem_to_smem(
            dos_ref.at[rows], do_smem.at[slot], chunk_bar.at[slot]))
        pl.when(cstep >= stages)(lambda: plgpu.barrier_arrive(chunk_bar.at[slot]))''')],
    "noexp": [(e, e[len("jnp.exp2"):]) for e in EXPS],
    "norescale": [(SOFTMAX_RESCALE, SOFTMAX_RESCALE.split("\n")[0])],
    "nosoftmax": [
        ('''        else:
          m_next, p = (masked_p if masked else unmasked_p)(s_RK)''',
         '''        elif not masked:
          plgpu.barrier_arrive(bars.k_free.at[slot])
          return m_prev, l_prev, s_RK.astype(q_tile.dtype), m_prev
        else:
          m_next, p = (masked_p if masked else unmasked_p)(s_RK)'''),
        (SOFTMAX_RESCALE, SOFTMAX_RESCALE.replace(
            "          acc = acc *", "          if masked:\n            acc = acc *"))],
    "notake": [(TAKE, '''  with jax.named_scope("take_rows"):
    pass
''')],
    "noepi": [
        ('''        q_tile[...] = (acc * lax.broadcast_in_dim(1.0 / l, acc.shape, [0])).astype(q_tile.dtype)
        scoped.row_out.at[wg][...] = (m + jnp.log2(l)) / _LOG2E  # natural-log lse
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_tile, o_ref.at[b, g, rows])''',
         '''        scoped.row_out.at[wg][...] = (m + jnp.log2(l) + acc.max(axis=1)) / _LOG2E
        plgpu.commit_smem()''')],
    "noturns": [(TURNS, '''  del turn
  nothing = lambda: None
  return nothing, nothing, nothing
''')],
    "dblsteps": [("""            steps_ref[flat], unmasked_ref[flat], box_ref[flat])""",
                  """            2 * steps_ref[flat], 2 * unmasked_ref[flat], box_ref[flat])""")],
    "allbox": [("  boxes = (jnp.zeros_like(blk) if all(presorted) else "
                "box_halves(layout, num_heads))",
                "  boxes = jnp.zeros_like(blk) if all(presorted) else jnp.full_like(blk, 3)")],
    "dqq": [(TAKE, '''  dq = len(scoped.stages) == 2
  with jax.named_scope("take_wait_store"):
    plgpu.wait_smem_to_gmem(1 if dq else 0, wait_read_only=True)
  with jax.named_scope("take_rows"):
    for stage, tile in list(zip(scoped.stages, scoped.tiles))[1 if dq else 0:]:
      tile.at[wg][...] = stage.at[wg][...]
''')],
}


def main():
  tree, name = pathlib.Path(sys.argv[1]), sys.argv[2]
  # The Hopper kernels: one module in trees before 2026-12-01's sixth session, a package after.
  package = tree / "pallas_kernels" / "moba" / "hopper"
  paths = sorted(package.glob("*.py")) if package.is_dir() else [package.with_suffix(".py")]
  texts = {path: path.read_text() for path in paths}
  for old, new in PROBES[name]:
    if sum(text.count(old) for text in texts.values()) != 1:
      raise SystemExit(f"{name}: expected one match of {old.splitlines()[0]!r} in {paths}")
    path = next(path for path, text in texts.items() if old in text)
    texts[path] = texts[path].replace(old, new)
  for path, text in texts.items():
    if text != path.read_text():
      path.write_text(text)
      print(f"{path}: probe {name}")


if __name__ == "__main__":
  main()
